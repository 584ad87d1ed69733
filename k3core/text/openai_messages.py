"""OpenAI chat `messages` -> k3 chat messages (the dicts k3core/text/chat.py renders): the one reading of them,
used by the server's chat completions (serve/schema.py) and `k3 bench drafts --transcripts`
(k3core/cli/bench/transcripts.py), so a recorded conversation is scored as the server would have rendered it.

developer is system; content is a string or a list of text parts joined (any other part is refused by name);
null or absent only on an assistant turn (one that only called tools, as OpenAI takes it, or only thought): a
system, user or tool message without content is refused; an assistant's reasoning_content is its thinking and its
tool_calls k3's call markup; a tool message is named by its `name`, else after the call its tool_call_id answers.
Every id and name is a string where given (`name`, `tool_call_id`, `tool_calls[j].id`). Anything else is a
MessageError naming the field as the request names it ("messages[2].tool_calls[0].function.arguments").
"""
from __future__ import annotations

import json
import re

from ..errors import UsageError
from ..files.limits import LimitError, loads_limited
from .chat import tool_call_markup

TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # a tool's name, as OpenAI takes it


class MessageError(UsageError):
    """OpenAI chat messages that are not: `param` names the field as the request does, `problem` what is wrong."""

    def __init__(self, param: str, problem: str):
        super().__init__(f"{param}: {problem}")
        self.param, self.problem = param, problem


def k3_messages(messages) -> list[dict]:
    """A request's `messages` (a non-empty list) as k3 chat messages (role, content, thinking, tools, name)."""
    if not isinstance(messages, list) or not messages:
        raise MessageError("messages", "must be a non-empty list of messages")
    out, names = [], {}  # tool_call_id -> the tool's name, from the assistant turns before
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise MessageError(where, "must be an object with role and content")
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None and not isinstance(m[key], str):
                raise MessageError(f"{where}.{key}", f"must be a string, got {type(m[key]).__name__}")
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role in ("system", "user"):
            out.append({"role": role, "content": content_text(_given(m, where), where)})
        elif role == "assistant":
            msg = {"role": "assistant", "content": content_text(m.get("content"), where)}
            thinking = m.get("reasoning_content")
            if thinking is not None:
                if not isinstance(thinking, str):
                    raise MessageError(f"{where}.reasoning_content", "must be a string")
                msg["thinking"] = thinking
            if m.get("tool_calls"):
                calls = tool_calls(m["tool_calls"], where)
                msg["tools"] = tool_call_markup(calls)
                for call, (name, _) in zip(m["tool_calls"], calls):
                    if isinstance(call.get("id"), str):
                        names[call["id"]] = name
            out.append(msg)
        elif role == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id"))
            if name is not None and (not isinstance(name, str) or not TOOL_NAME.match(name)):
                raise MessageError(f"{where}.name", "must be a tool name (letters, digits, _ and -)")
            out.append({"role": "tool", "content": content_text(_given(m, where), where), "name": name})
        else:
            raise MessageError(f"{where}.role", f"must be system, developer, user, assistant or tool, got {role!r}")
    return out


def _given(message: dict, where: str):
    """The content of a system, user or tool message, which must have one (null is an assistant's alone)."""
    if message.get("content") is None:
        problem = "must be a string or a list of text parts, got null" if "content" in message else "required"
        raise MessageError(f"{where}.content", f"{problem} (only an assistant message may have no content)")
    return message["content"]


def content_text(content, where: str) -> str:
    """A message's content: a string, null (an assistant's: see _given), or a list of text parts joined."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise MessageError(f"{where}.content[{j}]", f"only text parts are served, got {kind!r}")
            out.append(part["text"])
        return "".join(out)
    raise MessageError(f"{where}.content", f"must be a string or a list of text parts, got {type(content).__name__}")


def tool_calls(calls, where: str) -> list[tuple[str, dict]]:
    """An assistant message's tool_calls as (name, arguments) pairs, as tool_call_markup takes them."""
    if not isinstance(calls, list):
        raise MessageError(f"{where}.tool_calls", "must be a list")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if isinstance(call, dict) and call.get("id") is not None and not isinstance(call["id"], str):
            raise MessageError(f"{where}.tool_calls[{j}].id", f"must be a string, got {type(call['id']).__name__}")
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not TOOL_NAME.match(fn["name"]):
            raise MessageError(f"{where}.tool_calls[{j}].function.name",
                               "must be a tool name (letters, digits, _ and -)")
        out.append((fn["name"], tool_arguments(fn.get("arguments") or "{}",
                                               f"{where}.tool_calls[{j}].function.arguments")))
    return out


def tool_arguments(text, param: str) -> dict:
    """A tool call's arguments: a JSON object given as a string, nested no deeper than k3 parses
    (k3core/files/limits.py), or a MessageError naming `param`."""
    try:
        parsed = loads_limited(text, param) if isinstance(text, str) else None
    except json.JSONDecodeError:
        parsed = None
    except LimitError as exc:  # its message already names `param`
        raise MessageError(param, str(exc).removeprefix(f"{param}: ")) from None
    if not isinstance(parsed, dict):
        raise MessageError(param, "must be a JSON object, as a string")
    return parsed
