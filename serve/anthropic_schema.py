"""Anthropic Messages request bodies in, the ChatRequest chat completions runs out (serve/schema.py's, with
its field checks): `system` and content blocks become k3 chat messages, `tools` function declarations.

A known field of the wrong type or out of range is a 400 naming it; images, documents and server tools are
refused by name; unknown fields are ignored. Checked by tests/serve/test_anthropic_api.py.
"""
from __future__ import annotations

from k3core.text.chat import tool_call_markup

from .schema import TOOL_NAME, ApiError, ChatRequest, Sampling, _bad, _bool, _integer, _model, _number, _string, json_format

MAX_STOP_SEQUENCES = 16  # docs/LIMITS.md


def messages_request(body, max_tokens_limit: int, counting: bool = False) -> tuple[ChatRequest, list[str]]:
    """A Messages body as a ChatRequest, and where in the body each of its k3 messages came from (for
    errors found when they are rendered). `counting`: count_tokens, where max_tokens is not required."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    if body.get("max_tokens") is None and not counting:
        raise _bad("max_tokens", "required: the most tokens the reply may have")
    _not_served(body)
    messages, places = _conversation(body)
    tools, choice = _tools(body)
    sampling = Sampling(temperature=_number(body, "temperature", 0.0, 1.0),
                        top_p=_number(body, "top_p", 0.0, 1.0, 1.0, low_open=True),
                        max_tokens=_integer(body, "max_tokens", 1, max_tokens_limit), stop=_stop_sequences(body),
                        top_k=_integer(body, "top_k", 0) or 0, seed=_integer(body, "seed", 0, 2 ** 64 - 1))
    config = body.get("output_config")
    schema, where = json_format(config.get("format") if isinstance(config, dict) else None, "output_config.format",
                                None)
    return ChatRequest(model=_model(body), messages=messages, sampling=sampling, stream=_bool(body, "stream"),
                       tools=tools, tool_choice=choice, thinking=_thinking(body), response_schema=schema,
                       schema_param=where, parallel_calls=not _one_call(body)), places


def _blocks(content, path: str, kinds: tuple[str, ...]) -> list[dict]:
    """`content` (a string or a list of blocks at `path`) as blocks, each of one of `kinds`."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _bad(path, "must be a string or a list of content blocks")
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else type(block).__name__
        if kind in ("image", "document", "search_result"):
            raise _bad(f"{path}[{j}]", f"{kind} blocks are not served: k3 reads text only")
        if kind not in kinds:
            raise _bad(f"{path}[{j}]", f"must be a {' or '.join(kinds)} block here, got {kind!r}")
    return content


def _text(content, path: str) -> str:
    """Text content (a string, or text blocks) joined."""
    return "".join(_string(b, "text", f"{path}[{j}]") for j, b in enumerate(_blocks(content, path, ("text",))))


def _conversation(body: dict) -> tuple[tuple[dict, ...], list[str]]:
    """`system` and `messages` as k3 chat messages, with the body path each came from."""
    out, places, names = [], [], {}  # names: tool_use id -> the tool's name, from the assistant turns before
    if body.get("system") is not None:
        out.append({"role": "system", "content": _text(body["system"], "system")})
        places.append("system")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list of messages")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, "must be an object with role and content")
        if m.get("role") == "user":
            turns = _user_turns(m.get("content"), where, names)
        elif m.get("role") == "assistant":
            turns = [(_assistant_turn(m.get("content"), where, names), where)]
        else:
            raise _bad(f"{where}.role", f"must be user or assistant (system is a top-level field), got "
                       f"{m.get('role')!r}")
        out += [msg for msg, _ in turns]
        places += [place for _, place in turns]
    return tuple(out), places


def _user_turns(content, where: str, names: dict) -> list[tuple[dict, str]]:
    """A user message: its text as one user message, each tool_result as a tool message, in order."""
    turns, texts = [], []
    for j, block in enumerate(_blocks(content, f"{where}.content", ("text", "tool_result"))):
        path = f"{where}.content[{j}]"
        if block["type"] == "text":
            texts.append(_string(block, "text", path))
            continue
        if texts:
            turns.append(({"role": "user", "content": "".join(texts)}, where))
            texts = []
        name = names.get(block.get("tool_use_id"))
        if name is None:
            raise _bad(f"{path}.tool_use_id", "must be the id of a tool_use block in an earlier assistant message")
        result = block.get("content")
        text = "" if result is None else _text(result, f"{path}.content")
        turns.append(({"role": "tool", "content": text, "name": name}, path))
    if texts or not turns:
        turns.append(({"role": "user", "content": "".join(texts)}, where))
    return turns


def _assistant_turn(content, where: str, names: dict) -> dict:
    """An assistant message: its text, its thinking, and its tool_use blocks rendered as k3 renders calls."""
    texts, thinking, calls = [], [], []
    for j, block in enumerate(_blocks(content, f"{where}.content", ("text", "thinking", "tool_use"))):
        path = f"{where}.content[{j}]"
        if block["type"] == "text":
            texts.append(_string(block, "text", path))
        elif block["type"] == "thinking":
            thinking.append(_string(block, "thinking", path))  # its signature is not checked
        else:
            name = _string(block, "name", path)
            if not TOOL_NAME.match(name):
                raise _bad(f"{path}.name", "must be a tool name (letters, digits, _ and -)")
            if not isinstance(block.get("input"), dict):
                raise _bad(f"{path}.input", "must be an object")
            calls.append((name, block["input"]))
            names[block.get("id")] = name
    msg = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        msg["thinking"] = "".join(thinking)
    if calls:
        msg["tools"] = tool_call_markup(calls)
    return msg


def _tools(body: dict) -> tuple[tuple[dict, ...], str | None]:
    """`tools` as the function declarations chat completions take, and `tool_choice` as its choice."""
    tools, declared = body.get("tools"), []
    if tools is not None and not isinstance(tools, list):
        raise _bad("tools", "must be a list of tools")
    for j, t in enumerate(tools or []):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom":
            kind = t.get("type") if isinstance(t, dict) else t
            raise _bad(f"tools[{j}].type", "only client tools ({name, description, input_schema}) are served, got "
                       f"{kind!r}")
        name = _string(t, "name", f"tools[{j}]")
        if not TOOL_NAME.match(name):
            raise _bad(f"tools[{j}].name", "must be a tool name (letters, digits, _ and -)")
        if not isinstance(t.get("input_schema"), dict):
            raise _bad(f"tools[{j}].input_schema", "must be a JSON Schema object")
        declared.append({"name": name, "parameters": t["input_schema"]}
                        | ({"description": _string(t, "description", f"tools[{j}]")} if "description" in t else {}))
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if choice is None or kind == "auto":
        return tuple(declared), None
    if kind == "none" or (kind == "any" and declared):
        return tuple(declared), "none" if kind == "none" else "required"
    if kind == "tool" and choice.get("name") in {d["name"] for d in declared}:
        return tuple(declared), choice["name"]
    raise _bad("tool_choice", "must be {type: auto}, {type: none}, {type: any} or {type: tool, name} naming one of "
               "the tools")


def _one_call(body: dict) -> bool:
    """`tool_choice.disable_parallel_tool_use`: at most one tool call in the reply."""
    choice = body.get("tool_choice")
    one = choice.get("disable_parallel_tool_use", False) if isinstance(choice, dict) else False
    if not isinstance(one, bool):
        raise _bad("tool_choice.disable_parallel_tool_use", f"must be true or false, got {one!r}")
    return one


def _thinking(body: dict) -> bool:
    """K3's thinking mode: on for `enabled` and `adaptive` (K3 thinks on every turn in thinking mode)."""
    thinking = body.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if thinking is None or kind == "disabled":
        return False
    if kind not in ("enabled", "adaptive"):
        raise _bad("thinking", "must be {\"type\": \"enabled\", \"budget_tokens\": N}, {\"type\": \"adaptive\"} or "
                   f"{{\"type\": \"disabled\"}}, got {thinking!r}")
    budget = thinking.get("budget_tokens")
    if kind == "enabled" and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise _bad("thinking.budget_tokens", f"must be a positive integer, got {budget!r}")
    return True  # the budget is not a separate limit: max_tokens bounds thinking and answer together


def _not_served(body: dict) -> None:
    """Fields that would change what comes back, which k3 does not do yet: refused, never ignored."""
    if body.get("output_config") is not None and not isinstance(body["output_config"], dict):
        raise _bad("output_config", "must be an object, {\"format\": {\"type\": \"json_schema\", \"schema\": …}}")
    if body.get("mcp_servers"):
        raise _bad("mcp_servers", "MCP servers called by the API are not served: declare their tools in `tools`")


def _stop_sequences(body: dict) -> tuple[str, ...]:
    stops = body.get("stop_sequences")
    if stops is None:
        return ()
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise _bad("stop_sequences", "must be a list of strings")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise _bad("stop_sequences", f"at most {MAX_STOP_SEQUENCES} stop sequences, got {len(stops)}")
    return tuple(s for s in stops if s)
