"""OpenAI Responses request bodies in, the ChatRequest chat completions runs out (serve/schema.py's, with its
field checks): `instructions` and `input` items become k3 chat messages after a stored conversation
(`previous_response_id`), `tools` function declarations, `include` / `top_logprobs` the log-probabilities asked for.

A known field of the wrong type or out of range is a 400 naming it (every id and name is a string); `metadata` is
held to OpenAI's bounds (a stored response keeps it); images, files and built-in tools are refused by name;
unknown fields are ignored. Checked by tests/serve/test_responses_api.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from k3core.text.chat import tool_call_markup

from .schema import (IDENTIFIERS, MAX_TOP_LOGPROBS, REASONING_EFFORTS, TOOL_NAME, ApiError, ChatRequest, Sampling,
                     _arguments, _bad, _bool, _integer, _model, _number, _optional_string, _string, json_format,
                     metadata, placed)

ROLES = {"user": "user", "system": "system", "developer": "system", "assistant": "assistant"}
TEXT_PARTS = ("input_text", "output_text")
NOT_TEXT_PARTS = ("input_image", "input_file", "input_audio")
LOGPROBS = "message.output_text.logprobs"  # the one `include` value that adds to what k3 returns
INCLUDES_NOTHING = ("file_search_call.results", "web_search_call.results", "web_search_call.action.sources",
                    "code_interpreter_call.outputs", "computer_call_output.output.image_url",
                    "message.input_image.image_url",  # parts of items k3 never makes or reads: nothing to add
                    "reasoning.encrypted_content")  # k3's reasoning is plain text in the item's content already


@dataclass(frozen=True)
class Conversation:
    """k3 chat messages, where in the request each came from, and the tool each call id called."""

    messages: tuple[dict, ...] = ()
    places: tuple[str, ...] = ()
    names: dict = field(default_factory=dict)


def responses_request(body, max_tokens_limit: int, previous: Conversation | None) -> tuple[ChatRequest, Conversation]:
    """A Responses body as a ChatRequest, and its whole conversation; `previous` is the stored conversation
    `previous_response_id` names (looked up by the caller), or None."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    _not_served(body)
    for name in IDENTIFIERS:
        _optional_string(body, name)
    metadata(body)
    conversation = _conversation(body, previous or Conversation())
    tools, choice = _tools(body)
    tools, places = placed(tools)
    sampling = Sampling(temperature=_number(body, "temperature", 0.0, 2.0),
                        top_p=_number(body, "top_p", 0.0, 1.0, 1.0, low_open=True),
                        max_tokens=_integer(body, "max_output_tokens", 1, max_tokens_limit),
                        seed=_integer(body, "seed", 0, 2 ** 64 - 1))
    text = body.get("text")
    schema, where = json_format(text.get("format") if isinstance(text, dict) else None, "text.format", None)
    return ChatRequest(model=_model(body), messages=conversation.messages, sampling=sampling,
                       stream=_bool(body, "stream"), tools=tools, tool_choice=choice,
                       thinking=_thinking(body), response_schema=schema, schema_param=where,
                       logprobs=_logprobs(body), parallel_calls=_bool(body, "parallel_tool_calls", True),
                       tool_places=places), conversation


def _text(content, path: str) -> str:
    """Content: a string, or input_text / output_text parts joined; images and files refused by name."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(path, "must be a string or a list of input_text parts")
    out = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else type(part).__name__
        if kind in NOT_TEXT_PARTS:
            raise _bad(f"{path}[{j}]", f"{kind} is not served: k3 reads text only")
        if kind not in TEXT_PARTS:
            raise _bad(f"{path}[{j}].type", f"must be input_text or output_text, got {kind!r}")
        out.append(_string(part, "text", f"{path}[{j}]"))
    return "".join(out)


def _items(body: dict) -> list:
    given = body.get("input")
    if isinstance(given, str):
        return [{"role": "user", "content": given}]
    if not isinstance(given, list) or not given:
        raise _bad("input", "must be a string or a non-empty list of input items")
    return given


def _conversation(body: dict, previous: Conversation) -> Conversation:
    """The stored conversation, then `instructions` as a system message, then the input items in order: a
    reasoning item's text is the thinking of the assistant message after it, function_call items are the calls
    of the assistant message they follow (or of an empty one)."""
    out, places, names = list(previous.messages), list(previous.places), dict(previous.names)
    calls: dict[int, list] = {}  # an assistant message's index in `out` -> the (name, arguments) it called
    if body.get("instructions") is not None:
        if not isinstance(body["instructions"], str):
            raise _bad("instructions", "must be a string")
        out.append({"role": "system", "content": body["instructions"]})
        places.append("instructions")
    thinking = None  # a reasoning item's text, for the assistant message after it
    for i, item in enumerate(_items(body)):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else type(item).__name__
        fresh = len(out)
        if isinstance(item, dict):
            _optional_string(item, "id", where)
        if kind == "message":
            role = ROLES.get(item.get("role")) if isinstance(item.get("role"), str) else None
            if role is None:
                raise _bad(f"{where}.role", f"must be user, system, developer or assistant, got {item.get('role')!r}")
            out.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "reasoning":
            thinking = _reasoning(item.get("content"), f"{where}.content")
        elif kind == "function_call":
            name, arguments = _call(item, where)
            names[_string(item, "call_id", where)] = name
            if not (out and out[-1]["role"] == "assistant" and places[-1].startswith("input[")):
                out.append({"role": "assistant", "content": ""})
            calls.setdefault(len(out) - 1, []).append((name, arguments))
        elif kind == "function_call_output":
            name = names.get(_string(item, "call_id", where))
            if name is None:
                raise _bad(f"{where}.call_id", "must be the call_id of a function_call before it (in `input` or the "
                           "previous response)")
            out.append({"role": "tool", "content": _text(item.get("output"), f"{where}.output"), "name": name})
        else:
            raise _bad(f"{where}.type", "must be message, reasoning, function_call or function_call_output, got "
                       f"{kind!r}")
        if len(out) > fresh:
            places.append(where)
            if thinking is not None and out[-1]["role"] == "assistant":
                out[-1]["thinking"], thinking = thinking, None
    for at, made in calls.items():
        out[at]["tools"] = tool_call_markup(made)
    return Conversation(tuple(out), tuple(places), names)


def _reasoning(content, path: str) -> str:
    """A reasoning item's content: reasoning_text parts joined (none: no thinking text)."""
    if content is None:
        return ""
    if not isinstance(content, list) or not all(isinstance(p, dict) and p.get("type") == "reasoning_text"
                                                for p in content):
        raise _bad(path, "must be a list of reasoning_text parts")
    return "".join(_string(p, "text", f"{path}[{j}]") for j, p in enumerate(content))


def _call(item: dict, where: str) -> tuple[str, dict]:
    """A function_call item's tool name and its arguments (a JSON object, as a string)."""
    name = _string(item, "name", where)
    if not TOOL_NAME.match(name):
        raise _bad(f"{where}.name", "must be a tool name (letters, digits, _ and -)")
    return name, _arguments(_string(item, "arguments", where), f"{where}.arguments")


def _tools(body: dict) -> tuple[tuple[dict, ...], str | None]:
    """`tools` as the function declarations chat completions take, and `tool_choice` as its choice."""
    tools, declared = body.get("tools"), []
    if tools is not None and not isinstance(tools, list):
        raise _bad("tools", "must be a list of tools")
    for j, t in enumerate(tools or []):
        kind = t.get("type") if isinstance(t, dict) else type(t).__name__
        if kind != "function":
            raise _bad(f"tools[{j}].type", f"only function tools are served (k3 runs no built-in tools), got {kind!r}")
        name = _string(t, "name", f"tools[{j}]")
        if not TOOL_NAME.match(name):
            raise _bad(f"tools[{j}].name", "must be a tool name (letters, digits, _ and -)")
        if t.get("parameters") is not None and not isinstance(t["parameters"], dict):
            raise _bad(f"tools[{j}].parameters", "must be a JSON Schema object")
        _optional_string(t, "description", f"tools[{j}]")
        declared.append({k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
                        | {"place": f"tools[{j}].parameters"})
    choice = body.get("tool_choice")
    if isinstance(choice, dict):
        _optional_string(choice, "name", "tool_choice")
    if choice in (None, "auto"):
        return tuple(declared), None
    if choice == "none" or (choice == "required" and declared):
        return tuple(declared), choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str) and \
            choice["name"] in {d["name"] for d in declared}:
        return tuple(declared), choice["name"]
    raise _bad("tool_choice", "must be 'auto', 'none', 'required' (with tools) or {type: function, name} naming one "
               "of the tools")


def _thinking(body: dict) -> bool:
    """K3's thinking mode: on for any `reasoning.effort` but none and minimal (K3 has no finer effort)."""
    reasoning = body.get("reasoning")
    if reasoning is None:
        return False
    if not isinstance(reasoning, dict):
        raise _bad("reasoning", "must be an object, {\"effort\": ...}")
    effort = reasoning.get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise _bad("reasoning.effort", f"must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}")
    return effort not in (None, "none", "minimal")


def _logprobs(body: dict) -> int | None:
    """The alternatives per id (`top_logprobs`, 0..20) when `include` asks for the output text's log-probabilities;
    None when it does not (then, as OpenAI does, `top_logprobs` alone gives none)."""
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    return (top or 0) if LOGPROBS in _include(body) else None


def _include(body: dict) -> list[str]:
    """`include`: LOGPROBS, or values naming parts of items k3 never makes (INCLUDES_NOTHING); others are refused."""
    given = body.get("include")
    if given is None:
        return []
    if not isinstance(given, list):
        raise _bad("include", "must be a list of strings")
    for j, value in enumerate(given):
        if value not in (LOGPROBS, *INCLUDES_NOTHING):
            raise _bad(f"include[{j}]", f"{value!r} is not served: k3 can include {LOGPROBS!r}")
    return given


def _not_served(body: dict) -> None:
    """Fields that would change what comes back, which k3 does not do yet: refused, never ignored."""
    text = body.get("text")
    if text is not None and not isinstance(text, dict):
        raise _bad("text", "must be an object, {\"format\": {…}}")
    for name in ("conversation", "prompt"):
        if body.get(name) is not None:
            raise _bad(name, "not served: send the conversation as `input` (or `previous_response_id`)")
    if body.get("background"):
        raise _bad("background", "background responses are not served")
