"""Anthropic Messages request bodies in, the ChatRequest chat completions runs out (serve/schema.py's, with
its field checks): `system` and content blocks become k3 chat messages, `tools` function declarations.

A known field of the wrong type or out of range is a 400 naming it (every id and name is a string; `metadata` is
`{"user_id"}` alone, at most MAX_USER_ID characters); images, documents and server tools are refused by name;
fields the API defines that k3 cannot honour (`metadata`, `context_management`, an effort) are listed in
`ignored` for the route to log, never refused; unknown fields are ignored. What Claude Code
sends is read as it means it (docs/SERVER.md, "Claude Code"): `system`-role messages inside `messages` are
folded into the system text in order, its per-request billing-header block is left out of the prompt, and
`max_tokens` above what the context leaves is clamped by the route. Checked by
tests/serve/test_anthropic_api.py and tests/serve/test_claude_code_shapes.py.
"""
from __future__ import annotations

import base64
import binascii
from typing import NamedTuple

from k3core.text.chat import tool_call_markup

from .schema import (TOOL_NAME, ApiError, ChatRequest, Sampling, _bad, _bool, _integer, _model, _number,
                     _optional_string, _string, json_format, placed)

MAX_STOP_SEQUENCES = 16  # docs/LIMITS.md
MAX_USER_ID = 256  # `metadata.user_id`: an opaque id (Claude Code's is ~165 characters)
# Claude Code's first system block: `x-anthropic-billing-header: cc_version=…; cch=…;`, which changes on every
# request; left in the prompt, no two requests would share a prefix past its first ids.
BILLING_HEADER = "x-anthropic-billing-header:"
# A thinking block whose text the reply left out (`thinking.display: "omitted"`) carries it in its signature, so
# the turn sent back renders as it was generated.
SIGNATURE_PREFIX = "k3-thinking-v1:"
THINKING_DISPLAYS = ("summarized", "omitted")
TOOL_CHOICE_HEADER = "x-k3-tool-choice"  # a tool_choice for a user turn, from a client that sends no tool_choice
# Fields the Messages API defines that change nothing k3 does: why each is passed over (logged once by name).
IGNORED = {"metadata": "k3 keeps no per-user records",
           "context_management": "k3 keeps every block the request sends",
           "output_config.effort": "k3 has no effort setting (thinking is on or off)",
           "service_tier": "one engine serves every request",
           "container": "k3 runs no code containers",
           "inference_geo": "k3 runs here"}


class MessagesBody(NamedTuple):
    """A Messages body read: the ChatRequest, where each k3 message came from (messages[i] -> its body path, for
    errors found when they are rendered), whether thinking text is left out of the reply, and the fields
    passed over."""

    request: ChatRequest
    places: list[str]
    omit_thinking: bool
    ignored: tuple[str, ...]


def messages_request(body, counting: bool = False, tool_choice_header: str | None = None) -> MessagesBody:
    """A Messages body as a ChatRequest. `counting`: count_tokens, where max_tokens is not required. max_tokens
    may be any positive integer: the route clamps it to what the context leaves. `tool_choice_header`: the
    TOOL_CHOICE_HEADER the request came with, if any."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
    if tool_choice_header is not None:
        body = _header_choice(body, tool_choice_header.strip())
    if body.get("max_tokens") is None and not counting:
        raise _bad("max_tokens", "required: the most tokens the reply may have")
    _not_served(body)
    _metadata(body)
    messages, places, breakpoints = _conversation(body)
    tools, choice = _tools(body)
    tools, tool_places = placed(tools)
    sampling = Sampling(temperature=_number(body, "temperature", 0.0, 1.0),
                        top_p=_number(body, "top_p", 0.0, 1.0, 1.0, low_open=True),
                        max_tokens=_integer(body, "max_tokens", 1), stop=_stop_sequences(body),
                        top_k=_integer(body, "top_k", 0) or 0, seed=_integer(body, "seed", 0, 2 ** 64 - 1))
    config = body.get("output_config")
    schema, where = json_format(config.get("format") if isinstance(config, dict) else None, "output_config.format",
                                None)
    thinking, omit = _thinking(body)
    request = ChatRequest(model=_model(body), messages=messages, sampling=sampling, stream=_bool(body, "stream"),
                          tools=tools, tool_choice=choice, thinking=thinking, response_schema=schema,
                          schema_param=where, parallel_calls=not _one_call(body), breakpoints=breakpoints,
                          tool_places=tool_places)
    return MessagesBody(request, places, omit, _ignored(body))


def _metadata(body: dict) -> None:
    """`metadata`: the Messages API defines one field, `user_id` (a string or null); k3 keeps none of it."""
    given = body.get("metadata")
    if given is None:
        return
    if not isinstance(given, dict):
        raise _bad("metadata", "must be an object, {\"user_id\": …}")
    for key in given:
        if key != "user_id":
            raise _bad("metadata", f"the Messages API defines `user_id` alone, got {key[:64]!r}")
    _optional_string(given, "user_id", "metadata", MAX_USER_ID)


def _ignored(body: dict) -> tuple[str, ...]:
    config = body.get("output_config")
    given = {name for name in IGNORED if body.get(name) is not None}
    if isinstance(config, dict) and config.get("effort") is not None:
        given.add("output_config.effort")
    return tuple(sorted(given))


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


def _system_text(content, path: str) -> tuple[str, list[int]]:
    """System content as one text — a block that is Claude Code's billing header left out (a string is taken
    whole) — and the offsets in it where a block with `cache_control` ends."""
    if isinstance(content, str):
        return content, []
    text, breaks = "", []
    for j, block in enumerate(_blocks(content, path, ("text",))):
        piece = _string(block, "text", f"{path}[{j}]")
        if piece.startswith(BILLING_HEADER):
            continue
        text += piece
        if block.get("cache_control") is not None:
            breaks.append(len(text))
    return text, breaks


def _conversation(body: dict) -> tuple[tuple[dict, ...], list[str], tuple[tuple[int, int], ...]]:
    """`system` and `messages` as k3 chat messages, the body path each came from, and the cache_control
    breakpoints inside their text as (message index, offset in its content). `system`-role messages are folded
    into the one system message, in order, each after a blank line."""
    out, places, breaks, names = [], [], [], {}  # names: tool_use id -> the tool's name, from the assistant turns
    system, system_breaks, system_place = [], [], None
    if body.get("system") is not None:
        text, at = _system_text(body["system"], "system")
        system, system_breaks, system_place = [text], at, "system"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "must be a non-empty list of messages")
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, "must be an object with role and content")
        if m.get("role") == "system":
            text, at = _system_text(m.get("content"), f"{where}.content")
            start = sum(map(len, system)) + 2 * len(system)  # "\n\n" before every part but the first
            system.append(text)
            system_breaks += [start + a for a in at]
            system_place = system_place or where
            continue
        if m.get("role") == "user":
            turns = _user_turns(m.get("content"), where, names)
        elif m.get("role") == "assistant":
            turns = [(_assistant_turn(m.get("content"), where, names), where, ())]
        else:
            raise _bad(f"{where}.role", f"must be user, assistant or system, got {m.get('role')!r}")
        for msg, place, at in turns:
            breaks += [(len(out), a) for a in at]
            out.append(msg)
            places.append(place)
    if not out:
        raise _bad("messages", "must hold at least one user or assistant message")
    if system:  # the system message goes first: every other message moves one down
        out.insert(0, {"role": "system", "content": "\n\n".join(system)})
        places.insert(0, system_place)
        breaks = [(0, a) for a in system_breaks] + [(i + 1, a) for i, a in breaks]
    return tuple(out), places, tuple(breaks)


def _user_turns(content, where: str, names: dict) -> list[tuple[dict, str, list[int]]]:
    """A user message: its text as one user message, each tool_result as a tool message, in order; each with
    its body path and the offsets in its content where a block with `cache_control` ends."""
    turns, texts, marks = [], [], []
    for j, block in enumerate(_blocks(content, f"{where}.content", ("text", "tool_result"))):
        path = f"{where}.content[{j}]"
        if block["type"] == "text":
            texts.append(_string(block, "text", path))
            if block.get("cache_control") is not None:
                marks.append(sum(map(len, texts)))
            continue
        if texts:
            turns.append(({"role": "user", "content": "".join(texts)}, where, marks))
            texts, marks = [], []
        name = names.get(_string(block, "tool_use_id", path))
        if name is None:
            raise _bad(f"{path}.tool_use_id", "must be the id of a tool_use block in an earlier assistant message")
        result = block.get("content")
        text = "" if result is None else _text(result, f"{path}.content")
        turns.append(({"role": "tool", "content": text, "name": name}, path, []))
    if texts or not turns:
        turns.append(({"role": "user", "content": "".join(texts)}, where, marks))
    return turns


def _assistant_turn(content, where: str, names: dict) -> dict:
    """An assistant message: its text, its thinking, and its tool_use blocks rendered as k3 renders calls."""
    texts, thinking, calls = [], [], []
    for j, block in enumerate(_blocks(content, f"{where}.content", ("text", "thinking", "tool_use"))):
        path = f"{where}.content[{j}]"
        if block["type"] == "text":
            texts.append(_string(block, "text", path))
        elif block["type"] == "thinking":
            thinking.append(_string(block, "thinking", path) or _omitted_thinking(block, path))
        else:
            name = _string(block, "name", path)
            if not TOOL_NAME.match(name):
                raise _bad(f"{path}.name", "must be a tool name (letters, digits, _ and -)")
            if not isinstance(block.get("input"), dict):
                raise _bad(f"{path}.input", "must be an object")
            calls.append((name, block["input"]))
            names[_string(block, "id", path)] = name
    msg = {"role": "assistant", "content": "".join(texts)}
    if thinking:
        msg["thinking"] = "".join(thinking)
    if calls:
        msg["tools"] = tool_call_markup(calls)
    return msg


def _omitted_thinking(block: dict, path: str) -> str:
    """The text of a thinking block sent back without it (the reply left it out): what its signature carries.
    Any other signature is not checked, and its block's text ("") is what the turn shows."""
    signature = block.get("signature")
    if not isinstance(signature, str) or not signature.startswith(SIGNATURE_PREFIX):
        return ""
    try:
        return base64.b64decode(signature[len(SIGNATURE_PREFIX):], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise _bad(f"{path}.signature", "is not a signature k3 wrote (send the block back as the reply gave it)") \
            from None


def thinking_signature(text: str) -> str:
    """The signature of a thinking block whose text the reply leaves out: the text, for the turn sent back."""
    return SIGNATURE_PREFIX + base64.b64encode(text.encode()).decode()


def _tools(body: dict) -> tuple[tuple[dict, ...], str | None]:
    """`tools` as the function declarations chat completions take, and `tool_choice` as its choice. A tool with
    `defer_loading` is not declared in the prompt (the API loads such tools only when a search finds them,
    which k3 does not do), but stays callable by name."""
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
        if t.get("defer_loading") is not None and not isinstance(t["defer_loading"], bool):
            raise _bad(f"tools[{j}].defer_loading", f"must be true or false, got {t['defer_loading']!r}")
        if t.get("defer_loading"):
            continue
        declared.append({"name": name, "parameters": t["input_schema"], "place": f"tools[{j}].input_schema"}
                        | ({"description": _string(t, "description", f"tools[{j}]")} if "description" in t else {}))
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if isinstance(choice, dict):
        _optional_string(choice, "name", "tool_choice")
    if choice is None or kind == "auto":
        return tuple(declared), None
    if kind == "none" or (kind == "any" and declared):
        return tuple(declared), "none" if kind == "none" else "required"
    if kind == "tool" and choice.get("name") in {d["name"] for d in declared}:
        return tuple(declared), choice["name"]
    raise _bad("tool_choice", "must be {type: auto}, {type: none}, {type: any} or {type: tool, name} naming one of "
               "the tools")


def _header_choice(body: dict, header: str) -> dict:
    """The body with the tool_choice TOOL_CHOICE_HEADER asks for, for a client that cannot put one in its body
    (Claude Code can add headers: ANTHROPIC_CUSTOM_HEADERS): `any`, `auto`, `none` or a declared tool's name. It
    applies to a reply to the user's message only — not after tool results, where it would call tools forever —
    and never over a tool_choice the body names."""
    if body.get("tool_choice") is not None:
        return body
    turns = [m for m in body.get("messages") or [] if not (isinstance(m, dict) and m.get("role") == "system")]
    last = turns[-1] if turns else None  # system messages are folded into the system text, not turns
    content = last.get("content") if isinstance(last, dict) and last.get("role") == "user" else None
    if content is None or (isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result"
                                                             for b in content)):
        return body
    if header in ("any", "auto", "none"):
        return {**body, "tool_choice": {"type": header}}
    names = {t.get("name") for t in body.get("tools") or [] if isinstance(t, dict) and not t.get("defer_loading")
             and isinstance(t.get("name"), str)}
    if header not in names:
        raise ApiError(400, f"{TOOL_CHOICE_HEADER}: must be any, auto, none or the name of one of the request's tools, "
                       f"got {header[:64]!r}", param=TOOL_CHOICE_HEADER, code="invalid_value")
    return {**body, "tool_choice": {"type": "tool", "name": header}}


def _one_call(body: dict) -> bool:
    """`tool_choice.disable_parallel_tool_use`: at most one tool call in the reply."""
    choice = body.get("tool_choice")
    one = choice.get("disable_parallel_tool_use", False) if isinstance(choice, dict) else False
    if not isinstance(one, bool):
        raise _bad("tool_choice.disable_parallel_tool_use", f"must be true or false, got {one!r}")
    return one


def _thinking(body: dict) -> tuple[bool, bool]:
    """K3's thinking mode, on for `enabled` and `adaptive` (K3 thinks on every turn in thinking mode), and whether
    the reply leaves the thinking text out (`display: "omitted"`: the model still thinks)."""
    thinking = body.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, dict) else None
    if thinking is None or kind == "disabled":
        return False, False
    if kind not in ("enabled", "adaptive"):
        raise _bad("thinking", "must be {\"type\": \"enabled\", \"budget_tokens\": N}, {\"type\": \"adaptive\"} or "
                   f"{{\"type\": \"disabled\"}}, got {thinking!r}")
    budget = thinking.get("budget_tokens")
    if kind == "enabled" and (isinstance(budget, bool) or not isinstance(budget, int) or budget < 1):
        raise _bad("thinking.budget_tokens", f"must be a positive integer, got {budget!r}")
    display = thinking.get("display")
    if display is not None and display not in THINKING_DISPLAYS:
        raise _bad("thinking.display", f"must be one of {', '.join(THINKING_DISPLAYS)}, got {display!r}")
    return True, display == "omitted"  # the budget is not a separate limit: max_tokens bounds thinking and answer


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
