"""One try of one client library against an OpenAI-compatible server: run by clients_check.py with the python of
that library's own venv, it asks for a person the way the library's documentation does and prints one JSON line,
{"value": what the library returned} or {"error": "ExceptionClass: the message's first line"}.

It imports nothing of k3's and only the library it tries (inside that client's function); it does not judge the
value: clients_check.py validates it against PERSON with jsonschema. PERSON and Person are the same shape.
    python one_try.py CLIENT BASE_URL MODEL MAX_TOKENS
"""
import json
import sys

PROMPT = "Invent a person."
API_KEY = "k3-local"  # k3 serve asks for none; the SDKs refuse to start without one
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
TOOL = {"type": "function", "function": {"name": "record_person", "description": "Record a person.",
                                         "parameters": PERSON}}


def person_model():
    """The pydantic model every library is handed (pydantic comes with each of them)."""
    from pydantic import BaseModel

    class Person(BaseModel):
        name: str
        age: int

    return Person


def openai_client(url: str):
    from openai import OpenAI
    return OpenAI(base_url=url, api_key=API_KEY)


def instructor_try(url: str, model: str, max_tokens: int):
    """instructor's default mode (TOOLS): a forced call of a function named after the model."""
    import instructor
    client = instructor.from_openai(openai_client(url))
    person = client.chat.completions.create(model=model, response_model=person_model(), max_tokens=max_tokens,
                                            temperature=1, messages=[{"role": "user", "content": PROMPT}])
    return person.model_dump()


def openai_parse_try(url: str, model: str, max_tokens: int):
    """`.parse()`: response_format json_schema with strict, then pydantic; a `length` finish raises."""
    done = openai_client(url).chat.completions.parse(model=model, response_format=person_model(),
                                                     max_tokens=max_tokens, temperature=1,
                                                     messages=[{"role": "user", "content": PROMPT}])
    message = done.choices[0].message
    if message.parsed is None:
        raise ValueError(f"no parsed value; refusal {message.refusal!r}")
    return message.parsed.model_dump()


def openai_tool_try(url: str, model: str, max_tokens: int, tool_choice):
    done = openai_client(url).chat.completions.create(model=model, tools=[TOOL], tool_choice=tool_choice,
                                                      max_tokens=max_tokens, temperature=1,
                                                      messages=[{"role": "user", "content": PROMPT}])
    choice = done.choices[0]
    calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in choice.message.tool_calls or []]
    return {"finish_reason": choice.finish_reason, "tool_calls": calls}


def pydantic_ai_try(url: str, model: str, max_tokens: int):
    """An Agent with output_type: pydantic-ai's default output is a tool call (`final_result`)."""
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    chat = OpenAIChatModel(model, provider=OpenAIProvider(base_url=url, api_key=API_KEY))
    agent = Agent(chat, output_type=person_model())
    result = agent.run_sync(PROMPT, model_settings={"temperature": 1, "max_tokens": max_tokens})
    return result.output.model_dump()


def langchain_try(url: str, model: str, max_tokens: int):
    """`with_structured_output` in its default method."""
    from langchain_openai import ChatOpenAI
    chat = ChatOpenAI(model=model, base_url=url, api_key=API_KEY, temperature=1, max_tokens=max_tokens)
    return chat.with_structured_output(person_model()).invoke(PROMPT).model_dump()


TRIES = {
    "instructor": instructor_try,
    "openai-parse": openai_parse_try,
    "openai-tool-required": lambda url, model, n: openai_tool_try(url, model, n, "required"),
    "openai-tool-named": lambda url, model, n: openai_tool_try(
        url, model, n, {"type": "function", "function": {"name": TOOL["function"]["name"]}}),
    "pydantic-ai": pydantic_ai_try,
    "langchain": langchain_try,
}


def main() -> None:
    client, url, model, max_tokens = sys.argv[1:]
    try:
        print(json.dumps({"value": TRIES[client](url, model, int(max_tokens))}))
    except Exception as e:  # the library's failure is the measurement: its class and first line
        first = (str(e).strip().splitlines() or [""])[0]
        print(json.dumps({"error": f"{type(e).__name__}: {first}"}))


if __name__ == "__main__":
    main()
