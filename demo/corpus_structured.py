"""The demo corpus's structured part: short JSON replies and tool calls, so that a client asking the demo model for
JSON or forcing a tool call gets a short value that closes (issue 42).

k3 holds such a reply to its schema with a grammar (k3core/generation/structured.py), which writes every key and bracket
itself; the model writes only the values. So the model has to learn what a value looks like after its key — a
name, an age, a city, a capital, a number — and to close it. Three kinds of conversation:

- **json**: a request for a made-up person, a person to extract from the message ("Anna is 31 years old."), or a
  fact the demo knows asked for as JSON ("What is the capital of Peru? Answer in JSON.") — the reply is one JSON
  object written as k3's grammar writes JSON (`, ` and `: `, nothing else).
- **tool**: the same requests, and the weather or a sum of big numbers, with tools declared — the reply is an
  empty response and one call in the `tools` channel, `<|open|>call tool="NAME" index="1"<|sep|>` holding a `json`
  element (what the grammar of a forced call produces). A weather call or a sum is followed, half the time, by
  the tool's result and a one-line answer from it.
- **tool, declined**: tools declared, and a question the demo answers itself (a capital, a greeting): a plain reply.

Person tools come in the shapes client libraries send: a plain schema, one with titles and `required` in another
order (instructor), one with `additionalProperties: false` (pydantic-ai's `final_result`, OpenAI strict), one
with descriptions. Held out for evaluation: two request phrasings, two person tools (names and descriptions
never trained on) and a fifth of the invented names' first names.

Its own seeded Random, drawn after the chat categories: adding it changes none of their conversations, and
the tokenizer is learned from those alone (demo/train.py), so every id of the plain chat stays as it was.
"""
from __future__ import annotations

import json
import random

CATEGORIES = ("json", "tool", "tool-declined")
FIRST_NAMES = ["Anna", "Ben", "Clara", "David", "Elena", "Felix", "Grace", "Hugo", "Ida", "Jonas", "Karin", "Liam",
               "Maria", "Noah", "Olga", "Paul", "Rosa", "Samuel", "Tara", "Victor", "Wendy", "Yusuf", "Zoe", "Amir",
               "Beatriz", "Chen", "Dmitri", "Fatima", "Hana", "Ivan", "Julia", "Kofi", "Lucia", "Mateo", "Nina",
               "Omar", "Priya", "Ravi", "Sofia", "Tom"]
LAST_NAMES = ["Smith", "Garcia", "Müller", "Rossi", "Kim", "Novak", "Silva", "Jensen", "Okafor", "Tanaka", "Dubois",
              "Nowak", "Costa", "Larsen", "Ahmed", "Ivanova", "Moreau", "Fischer", "Haddad", "Lopez", "Berg",
              "Kowalski", "Santos", "Weber", "Park", "Mensah", "Reyes", "Schmidt", "Varga", "Wong"]
CITIES = ["Paris", "Tokyo", "Lima", "Cairo", "Oslo", "Nairobi", "Madrid", "Berlin", "Rome", "Seoul", "Hanoi",
          "Dublin", "Vienna", "Quito", "Accra", "Lisbon", "Athens", "Warsaw", "Prague", "Havana", "Manila",
          "Ottawa", "Canberra", "Santiago", "Bangkok", "Helsinki", "Budapest", "Dakar", "Tunis", "Riga"]
SKIES = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy"]

PERSON_REQUESTS = ["Invent a person.", "Make up a person.", "Invent someone.", "Create a person.",
                   "Give me a random person.", "Make up a character.", "Invent a fictional person.",
                   "Create a character.", "Invent a person with a name and an age.", "Think of a person.",
                   "Generate a person.", "invent a person"]
PERSON_REQUESTS_HELD = ["Come up with a person.", "Imagine a person."]
EXTRACT_REQUESTS = ["{name} is {age} years old.", "Extract the person: {name} is {age} years old.",
                    "My name is {name} and I am {age}.", "{name}, {age}.", "Record {name}, aged {age}.",
                    "Save {name}, who is {age}."]
JSON_SUFFIXES = [" Answer in JSON.", " Reply with JSON.", " Give the answer as JSON.", " (JSON)"]

PERSON_TOOLS = [("record_person", "Record a person."),
                ("Person", "Correctly extracted `Person` with all the required parameters with correct types"),
                ("final_result", "The final response which ends this conversation"),
                ("save_person", "Save a person to the address book."), ("add_contact", "Add a contact."),
                ("create_user", "Create a user account.")]
PERSON_TOOLS_HELD = [("store_person", "Store one person."), ("new_employee", "Register a new employee.")]
WEATHER_TOOL = {"name": "get_weather", "description": "Get the current weather in a city.",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ADD_TOOL = {"name": "add", "description": "Add two integers.",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "required": ["a", "b"]}}
SEARCH_TOOL = {"name": "search_web", "description": "Search the web.",  # declared beside others, never called
               "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}


def person_schema(shape: int) -> dict:
    """The person schema as clients send it: 0 plain, 1 instructor's (titles, `required` age first), 2 strict
    (additionalProperties false), 3 with descriptions."""
    if shape == 1:
        return {"properties": {"name": {"title": "Name", "type": "string"}, "age": {"title": "Age", "type": "integer"}},
                "required": ["age", "name"], "type": "object"}
    if shape == 3:
        return {"type": "object", "properties": {"name": {"type": "string", "description": "The person's full name"},
                                                 "age": {"type": "integer", "description": "Age in years"}},
                "required": ["name", "age"]}
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    return {**schema, "additionalProperties": False} if shape == 2 else schema


def compact(value) -> str:
    """JSON as k3's grammar writes it (structured.JSON_STYLE: `, ` and `: `, no other whitespace)."""
    return json.dumps(value, ensure_ascii=False)


def call_markup(name: str, arguments: dict) -> str:
    """A `tools` channel holding one call, as a forced call's grammar writes it (a `json` element)."""
    return (f'<|open|>call tool="{name}" index="1"<|sep|><|open|>json<|sep|>{compact(arguments)}'
            f'<|close|>json<|sep|><|close|>call<|sep|>')


def _conv(category: str, messages: list[dict], key: str, tools: list[dict] | None = None, **extra) -> dict:
    conv = {"messages": messages, "mode": "instruct", "category": category,
            "expect": messages[-1].get("content", ""), "key": key, **extra}
    if tools:
        conv["tools"] = tools
    return conv


def _person(rng: random.Random, firsts: list[str]) -> dict:
    return {"name": f"{rng.choice(firsts)} {rng.choice(LAST_NAMES)}", "age": rng.randint(18, 90)}


def _person_request(rng: random.Random, requests: list[str], firsts: list[str]) -> tuple[str, dict]:
    """A request and the person that answers it: invented, or named in the request."""
    person = _person(rng, firsts)
    if rng.random() < 0.3:
        return rng.choice(EXTRACT_REQUESTS).format(**person), person
    return rng.choice(requests), person


def _tools_with(rng: random.Random, tool: dict) -> list[dict]:
    """`tool`, alone or among one or two others, in a random order."""
    others = [t for t in (WEATHER_TOOL, ADD_TOOL, SEARCH_TOOL) if t["name"] != tool["name"]]
    tools = [tool] + rng.sample(others, rng.choice([0, 0, 0, 1, 2]))
    rng.shuffle(tools)
    return tools


def _person_tool(name: str, description: str, shape: int) -> dict:
    return {"name": name, "description": description, "parameters": person_schema(shape)}


def _json_person(rng, requests, firsts) -> dict:
    q, person = _person_request(rng, requests, firsts)
    shape = rng.random()
    if shape < 0.12:
        person = {"name": person["name"]}
    elif shape < 0.2:
        person = {**person, "city": rng.choice(CITIES)}
    elif shape < 0.28:
        person = {"age": person["age"], "name": person["name"]}
    return _conv("json", [{"role": "user", "content": q}, {"role": "assistant", "content": compact(person)}], "name")


def _json_fact(rng, capitals, arith) -> dict:
    suffix = rng.choice(JSON_SUFFIXES)
    if rng.random() < 0.6:
        country, capital = rng.choice(capitals)
        q, value = f"What is the capital of {country}?{suffix}", {"country": country, "capital": capital}
        if rng.random() < 0.5:
            value = {"capital": capital}
    else:
        a, b, sym, c = rng.choice(arith)
        q, value = f"What is {a} {sym} {b}?{suffix}", {"result": c}
    return _conv("json", [{"role": "user", "content": q}, {"role": "assistant", "content": compact(value)}], "{")


def _person_call(rng, requests, firsts, tool_names) -> dict:
    q, person = _person_request(rng, requests, firsts)
    name, description = rng.choice(tool_names)
    tool = _person_tool(name, description, rng.randrange(4))
    messages = [{"role": "user", "content": q},
                {"role": "assistant", "content": "", "tools": call_markup(name, person)}]
    return _conv("tool", messages, name, _tools_with(rng, tool), arguments=person)


def _weather_call(rng) -> dict:
    city = rng.choice(CITIES)
    q = rng.choice(["What is the weather in {c}?", "What's the weather like in {c}?", "Weather in {c}?",
                    "Is it raining in {c}?", "How warm is it in {c}?"]).format(c=city)
    messages = [{"role": "user", "content": q},
                {"role": "assistant", "content": "", "tools": call_markup("get_weather", {"city": city})}]
    if rng.random() < 0.5:
        sky, degrees = rng.choice(SKIES), rng.randint(-5, 35)
        messages += [{"role": "tool", "name": "get_weather",
                      "content": compact({"city": city, "sky": sky, "temperature": degrees})},
                     {"role": "assistant", "content": f"It is {sky} in {city}, {degrees} °C."}]
    return _conv("tool", messages, "get_weather", _tools_with(rng, WEATHER_TOOL), arguments={"city": city})


def _add_call(rng) -> dict:
    a, b = rng.randint(13, 999), rng.randint(13, 999)
    q = rng.choice(["What is {a} + {b}?", "{a} + {b} = ?", "What is {a} plus {b}?", "Add {a} and {b}."]).format(a=a,
                                                                                                                 b=b)
    messages = [{"role": "user", "content": q},
                {"role": "assistant", "content": "", "tools": call_markup("add", {"a": a, "b": b})}]
    if rng.random() < 0.5:
        messages += [{"role": "tool", "name": "add", "content": str(a + b)},
                     {"role": "assistant", "content": f"{a} + {b} = {a + b}."}]
    return _conv("tool", messages, "add", _tools_with(rng, ADD_TOOL), arguments={"a": a, "b": b})


def _declined(rng, plain: list[dict]) -> dict:
    """A question the demo answers itself, asked with tools declared that do not answer it."""
    conv = rng.choice(plain)
    return {**_conv("tool-declined", [dict(m) for m in conv["messages"]], conv["key"],
                    _tools_with(rng, rng.choice([WEATHER_TOOL, ADD_TOOL]))), "expect": conv["expect"]}


def build(seed: int, capitals: list[tuple[str, str]], plain: list[dict], counts: dict | None = None) -> dict:
    """{"train": [...], "json_eval": [...], "tool_eval": [...]}. `capitals`: (country, capital) pairs; `plain`:
    trained instruct-mode chat conversations the demo answers (for tools declined)."""
    rng = random.Random(seed + 4242)
    n = {"json_person": 600, "json_fact": 250, "person_call": 220, "weather": 70, "add": 50, "declined": 40,
         **(counts or {})}
    firsts = list(FIRST_NAMES)
    rng.shuffle(firsts)
    held_firsts, firsts = firsts[:len(firsts) // 5], firsts[len(firsts) // 5:]
    arith = [(a, b, sym, fn(a, b)) for sym, fn in (("+", int.__add__), ("×", int.__mul__))
             for a in range(13) for b in range(13)]
    train = ([_json_person(rng, PERSON_REQUESTS, firsts) for _ in range(n["json_person"])]
             + [_json_fact(rng, capitals, arith) for _ in range(n["json_fact"])]
             + [_person_call(rng, PERSON_REQUESTS, firsts, PERSON_TOOLS) for _ in range(n["person_call"])]
             + [_weather_call(rng) for _ in range(n["weather"])] + [_add_call(rng) for _ in range(n["add"])]
             + [_declined(rng, plain) for _ in range(n["declined"])])
    json_eval = [_json_person(rng, PERSON_REQUESTS_HELD, held_firsts) for _ in range(40)]
    tool_eval = [_person_call(rng, PERSON_REQUESTS_HELD, held_firsts, PERSON_TOOLS_HELD) for _ in range(40)]
    return {"train": train, "json_eval": json_eval, "tool_eval": tool_eval}
