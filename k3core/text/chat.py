"""Chat: messages -> prompt ids in K3's XTML structure (MODEL.md §7), and a generated reply -> its parts.

An element is `<|open|>tag attrs<|sep|>body<|close|>tag<|sep|>` (the four markers are special
tokens); every message is its elements followed by `<|end_of_msg|>`. system / user messages are
one element named after the role; a tool result is `tool_result` (attribute ` name="…"` if given);
an assistant message is its channels: `think` (only if the message has `thinking`), `response`
(always, possibly empty), `tools` (only if it has `tools`). The generation prefix opens the first
channel: `<|open|>response<|sep|>` (instruct) or `<|open|>think<|sep|>` (thinking). Worked example
(line breaks added for reading; there is no text between elements):

    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
     {"role": "assistant", "thinking": "Greet back.", "content": "Hello!"},
     {"role": "user", "content": "2+2?"}]   rendered in thinking mode:
    <|open|>system<|sep|>Be brief.<|close|>system<|sep|><|end_of_msg|>
    <|open|>user<|sep|>Hi<|close|>user<|sep|><|end_of_msg|>
    <|open|>think<|sep|>Greet back.<|close|>think<|sep|><|open|>response<|sep|>Hello!<|close|>response<|sep|><|end_of_msg|>
    <|open|>user<|sep|>2+2?<|close|>user<|sep|><|end_of_msg|>
    <|open|>think<|sep|>                                    (instruct: <|open|>response<|sep|>)

and the model continues `4 is…<|close|>think<|sep|><|open|>response<|sep|>4<|close|>response<|sep|><|end_of_msg|>`.
A past assistant turn is rendered from what the message holds, whatever the current mode: keep
its `thinking` and the history re-renders exactly as it was generated (so §4.5 state reuse
works); drop it and it is not shown. No `[BOS]`: MODEL.md §7 adds none to raw prompts, and the opening
`<|open|>` already marks the start (a checkpoint template may still emit `bos_token`).

Two paths, same ids. With `chat_template` in tokenizer_config.json, it is rendered in a jinja2
ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks) with: `messages` (normalised: `role`,
`content` str, plus `thinking` / `tools` / `name` only when given), `add_generation_prompt`,
`mode`, `thinking` and `enable_thinking` (bools), `bos_token`, `eos_token` (`<|end_of_msg|>`),
`tools` (the declarations, or None), `raise_exception(msg)`, filter `tojson`; the text is encoded
with special tokens allowed. Since markup typed into a message would then become real markup, that
path refuses such text unless `allow_markup_in_text=True`. Without a template, the builder
assembles ids itself: markers by id, each text run between markers by `tokenizer.encode(run)` with
specials NOT allowed. `CHAT_TEMPLATE` renders exactly what the builder builds (tests/text/test_chat.py
checks both); a template that ignores `tools` gets them declared the builder's way.

Assistant turns are text like any other message (a client may send any history), except for an
exact `tool_call_markup` in `tools`; `own_replies=True` marks them as the model's own replies (a
session's history from split_reply), whose markup stays markup.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Sequence

from ..errors import CheckpointError, K3Error, UsageError

OPEN, SEP, CLOSE, EOM = "<|open|>", "<|sep|>", "<|close|>", "<|end_of_msg|>"
MODES = {"instruct": "response", "thinking": "think"}  # mode -> the channel the prefix opens
FIELDS = {"system": ("content",), "user": ("content",), "assistant": ("content", "thinking", "tools"),
          "tool": ("content", "name")}

CHAT_TEMPLATE = (
    "{%- macro el(tag, body, attrs='') -%}"
    "<|open|>{{ tag }}{{ attrs }}<|sep|>{{ body }}<|close|>{{ tag }}<|sep|>"
    "{%- endmacro -%}"
    "{%- if tools -%}{{ el('tool_declarations', tools | tojson) }}<|end_of_msg|>{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- if m.thinking is defined and m.thinking is not none -%}{{ el('think', m.thinking) }}{%- endif -%}"
    "{{ el('response', m.content if m.content is not none else '') }}"
    "{%- if m.tools is defined and m.tools is not none -%}{{ el('tools', m.tools) }}{%- endif -%}"
    "{%- elif m.role == 'tool' -%}"
    "{{ el('tool_result', m.content, (' name=\"' ~ m.name ~ '\"') if m.name is defined and m.name else '') }}"
    "{%- else -%}"
    "{{ el(m.role, m.content) }}"
    "{%- endif -%}"
    "<|end_of_msg|>"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|open|>{{ 'think' if thinking else 'response' }}<|sep|>{%- endif -%}"
)


def _check_mode(mode: str) -> str:
    if mode not in MODES:
        raise UsageError(f"chat mode must be 'instruct' or 'thinking', got {mode!r}")
    return MODES[mode]


def normalize(messages: Sequence[Mapping]) -> list[dict]:
    """Check messages and return plain dicts: role, content (str; None -> ""), other fields if not None."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise UsageError(f"message {i}: must be a dict with 'role' and 'content', got {type(m).__name__}")
        role = m.get("role")
        if role not in FIELDS:
            raise UsageError(f"message {i}: role must be one of {', '.join(FIELDS)}; got {role!r}")
        unknown = sorted(set(m) - {"role", *FIELDS[role]})
        if unknown:
            raise UsageError(f"message {i} ({role}): unknown field(s) {unknown}; allowed: {', '.join(FIELDS[role])}")
        n = {"role": role, "content": "" if m.get("content") is None else m["content"]}
        n.update((k, m[k]) for k in FIELDS[role][1:] if m.get(k) is not None)
        for k, v in n.items():
            if not isinstance(v, str):
                raise UsageError(f"message {i} ({role}): {k!r} must be a string, got {type(v).__name__}")
        if "name" in n and (not n["name"] or any(ch in n["name"] for ch in '"\r\n')):
            raise UsageError(f"message {i} (tool): name must be non-empty, without quotes or newlines: {n['name']!r}")
        out.append(n)
    return out


def _element(tag: str, body, attrs: str = "") -> list[tuple[bool, str]]:
    inner = body if isinstance(body, list) else [(False, body)]
    return [(True, OPEN), (False, tag + attrs), (True, SEP), *inner, (True, CLOSE), (False, tag), (True, SEP)]


_MARKERS = re.compile("(" + "|".join(re.escape(m) for m in (OPEN, SEP, CLOSE, EOM)) + ")")


def _model_text(text: str) -> list[tuple[bool, str]]:
    """An assistant field as the model wrote it: markup inside (a tools channel's calls) stays markup."""
    return [(i % 2 == 1, piece) for i, piece in enumerate(_MARKERS.split(text)) if piece]


def _body(m: dict, key: str, own_replies: bool) -> list[tuple[bool, str]]:
    """A field of a normalised message as (is_marker, text) pieces: text, like everything people send —
    except in the model's own replies (`own_replies`: a session's history, as split_reply gave it), whose
    markup stays markup, and in an assistant's `tools` that is exactly k3's markup for its calls."""
    text = m[key]
    if m["role"] == "assistant" and (own_replies or key == "tools" and _is_call_markup(text)):
        return _model_text(text)
    return [(False, text)]


def _declarations(tools: Sequence[Mapping]) -> list[tuple[bool, str]]:
    """Tool declarations (OpenAI's function objects) as one `tool_declarations` element holding their JSON."""
    return _element("tool_declarations", json.dumps(list(tools), ensure_ascii=False)) + [(True, EOM)]


def segments(messages, mode: str = "instruct", add_generation_prompt: bool = True,
             tools: Sequence[Mapping] | None = None, own_replies: bool = False) -> list[tuple[bool, str]]:
    """The conversation as (is_marker, text) pieces; joined, they are the markup string. `tools`: tool
    declarations, rendered first (`_declarations`). `own_replies`: see `render`."""
    channel = _check_mode(mode)
    segs: list[tuple[bool, str]] = _declarations(tools) if tools else []
    for m in normalize(messages):
        if m["role"] == "assistant":
            if "thinking" in m:
                segs += _element("think", _body(m, "thinking", own_replies))
            segs += _element("response", _body(m, "content", own_replies))
            if "tools" in m:
                segs += _element("tools", _body(m, "tools", own_replies))
        elif m["role"] == "tool":
            segs += _element("tool_result", m["content"], f' name="{m["name"]}"' if "name" in m else "")
        else:
            segs += _element(m["role"], m["content"])
        segs.append((True, EOM))
    if add_generation_prompt:
        segs += [(True, OPEN), (False, channel), (True, SEP)]
    return segs


def build_ids(tokenizer, segs) -> list[int]:
    """Markers by id; each maximal text run encoded once, specials not allowed (no injection)."""
    ids: list[int] = []
    run = ""
    for is_marker, text in segs + [(True, None)]:
        if not is_marker:
            run += text
            continue
        if run:
            ids += tokenizer.encode(run)
            run = ""
        if text is not None:
            ids.append(tokenizer.id_of(text))
    return ids


def chat_template(tokenizer) -> str | None:
    """The checkpoint's template: a string, or the entry named "default" of a list of them."""
    t = (getattr(tokenizer, "config", None) or {}).get("chat_template")
    if isinstance(t, list):
        t = next((x.get("template") for x in t if isinstance(x, dict) and x.get("name") == "default"), None)
    return t if isinstance(t, str) and t else None


def _raise_exception(message):
    raise UsageError(f"the chat template refused the conversation: {message}")


@lru_cache(maxsize=8)
def _compile(template: str):
    from jinja2 import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = lambda v, indent=None: json.dumps(v, ensure_ascii=False, indent=indent)
    env.globals["raise_exception"] = _raise_exception
    try:
        return env.from_string(template)
    except TemplateError as exc:
        raise CheckpointError(f"tokenizer_config.json: chat_template does not compile: {exc}") from None


def render_template(template: str, messages, mode: str = "instruct", add_generation_prompt: bool = True,
                    bos_token: str = "", tools: Sequence[Mapping] | None = None) -> str:
    """The template's text for these messages (the variables are listed in the module docstring)."""
    from jinja2 import TemplateError

    _check_mode(mode)
    try:
        return _compile(template).render(
            messages=normalize(messages), add_generation_prompt=add_generation_prompt, mode=mode,
            thinking=mode == "thinking", enable_thinking=mode == "thinking", bos_token=bos_token, eos_token=EOM,
            tools=list(tools) if tools else None)
    except TemplateError as exc:
        raise CheckpointError(f"tokenizer_config.json: chat_template failed to render: {exc}") from None


class ChatInputError(UsageError):
    """Chat input that will not be rendered as given; `param` names it: "tools" (the declarations) or
    "messages[I].FIELD" (a message's field, by the names `normalize` gives them)."""

    def __init__(self, param: str, problem: str):
        super().__init__(f"{param}: {problem}")
        self.param, self.problem = param, problem


def _special_text(tokenizer, text: str) -> bool:
    """Whether `text` spells a special token, which encoding with specials allowed would turn into its id."""
    return tokenizer.encode(text, allow_special=True) != tokenizer.encode(text)


def render(messages, tokenizer, mode: str = "instruct", *, add_generation_prompt: bool = True,
           use_template: bool = True, allow_markup_in_text: bool = False,
           tools: Sequence[Mapping] | None = None, own_replies: bool = False) -> list[int]:
    """Prompt ids for `messages` (and `tools`, declarations the model may call): the checkpoint's
    chat_template if it has one (and use_template), else the builder. Assistant turns are text like any
    other message's (a client's account of the conversation), but for a `tools` field that is exactly k3's
    markup for its calls (tool_call_markup); `own_replies=True` says they are the model's own replies as
    split_reply gave them (a session's history), whose markup stays markup. Text that spells a special token
    is refused (ChatInputError) where the template would make it markup, unless `allow_markup_in_text`."""
    template = chat_template(tokenizer) if use_template else None
    if template is None:
        return build_ids(tokenizer, segments(messages, mode, add_generation_prompt, tools, own_replies))
    if not allow_markup_in_text:  # text the template would turn into markup (the builder keeps it text): refused
        for i, m in enumerate(normalize(messages)):
            if m["role"] == "assistant" and own_replies:
                continue  # the model's own tokens, not input
            for k in [k for k in m if k != "role"]:
                if any(not marker and _special_text(tokenizer, text) for marker, text in _body(m, k, own_replies)):
                    raise ChatInputError(f"messages[{i}].{k}", "contains special-token text, which the chat "
                                         "template would turn into markup")
        if tools and _special_text(tokenizer, json.dumps(list(tools), ensure_ascii=False)):
            raise ChatInputError("tools", "the declarations contain special-token text, which the chat template "
                                 "would turn into markup")
    try:
        bos = "[BOS]" if tokenizer.id_of("[BOS]") is not None else ""
    except (LookupError, ValueError, K3Error):
        bos = ""
    text = render_template(template, messages, mode, add_generation_prompt, bos, tools)
    if tools and text == render_template(template, messages, mode, add_generation_prompt, bos):
        text = _declared(tokenizer, tools, text, bos)  # the template ignores `tools`: never dropped silently
    return tokenizer.encode(text, allow_special=True)


def _declared(tokenizer, tools: Sequence[Mapping], text: str, bos: str) -> str:
    """A template's `text` with the tools it ignored declared as the builder declares them: first (after a
    BOS the template put first), in XTML — which the tokenizer must have, else the request is refused."""
    try:
        for marker in (OPEN, SEP, CLOSE, EOM):
            tokenizer.id_of(marker)
    except (LookupError, ValueError, K3Error):
        raise ChatInputError("tools", "the chat template does not render tool declarations, and the tokenizer has "
                             "no XTML markup (<|open|> …) to declare them in; send the request without tools") from None
    head = bos if bos and text.startswith(bos) else ""
    return head + "".join(piece for _, piece in _declarations(tools)) + text[len(head):]


@dataclass
class Reply:
    """A generated reply split by channel. `thinking`/`tools` are None when that channel never opened."""

    content: str
    thinking: str | None
    tools: str | None
    finished: bool  # <|end_of_msg|> was generated (False: cut off, e.g. by max_tokens, maybe mid-thinking)

    def message(self) -> dict:
        m = {"role": "assistant", "content": self.content}
        m.update((k, v) for k, v in (("thinking", self.thinking), ("tools", self.tools)) if v is not None)
        return m


def split_reply(ids: Sequence[int], tokenizer, mode: str = "instruct") -> Reply:
    """Split the ids generated after the generation prefix (which opened `think` or `response`).

    Stops at `<|end_of_msg|>`. Elements nested inside a channel stay in its text, markup included;
    text outside any element counts as response; a repeated channel is concatenated."""
    o, s, c, e = (tokenizer.id_of(t) for t in (OPEN, SEP, CLOSE, EOM))
    current: str | None = _check_mode(mode)
    chans: dict[str, list[int]] = {current: []}
    ids, i, depth, finished = [int(t) for t in ids], 0, 0, False
    while i < len(ids):
        t = ids[i]
        if t == e:
            finished = True
            break
        if t in (o, c):
            j = i + 1
            while j < len(ids) and ids[j] != s:  # the tag (and attributes) run to <|sep|>
                j += 1
            if current is not None and (depth > 0 or t == o):  # nested element: keep as text
                depth += 1 if t == o else -1
                chans[current] += ids[i:j + 1]
            elif t == o:
                header = tokenizer.decode(ids[i + 1:j]).split()
                current = (header or [""])[0] if j < len(ids) else None
                if current is not None:
                    chans.setdefault(current, [])
            else:
                current = None
            i = j + 1
            continue
        chans.setdefault(current or "response", []).append(t)
        i += 1
    text = {k: tokenizer.decode(v) for k, v in chans.items()}
    return Reply(text.get("response", ""), text.get("think"), text.get("tools"), finished)


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote in its `tools` channel."""

    name: str
    arguments: dict
    complete: bool  # its `<|close|>call<|sep|>` was generated (False: cut off mid-call)


_ATTR = re.compile(r'(\w+)="([^"]*)"')
_SAFE_KEY = re.compile(r'^[^"<>\r\n]+$')


def _call_segments(calls: Sequence[tuple[str, Mapping]]) -> list[tuple[bool, str]]:
    out: list[tuple[bool, str]] = []
    for index, (name, arguments) in enumerate(calls, start=1):
        if all(isinstance(k, str) and _SAFE_KEY.match(k) for k in arguments):
            body = [piece for k, v in arguments.items() for piece in _element(
                "argument", v if isinstance(v, str) else json.dumps(v, ensure_ascii=False),
                f' key="{k}" type="{"string" if isinstance(v, str) else "json"}"')]
        else:
            body = _element("json", json.dumps(dict(arguments), ensure_ascii=False))
        out += _element("call", body, f' tool="{name}" index="{index}"')
    return out


def tool_call_markup(calls: Sequence[tuple[str, Mapping]]) -> str:
    """The `tools` channel text for (name, arguments) calls: per call an element `call tool="NAME"
    index="N"` holding one `argument key="K" type="string|json"` element per argument (a string verbatim,
    anything else as JSON), or one `json` element when a key cannot be an attribute."""
    return "".join(piece for _, piece in _call_segments(calls))


def _is_call_markup(text: str) -> bool:
    """Whether `text` is exactly tool_call_markup's rendering of the calls in it, so that each of its markers
    is k3's own structure and none of them is spelled inside a name, key or value."""
    calls = [(c.name, c.arguments) for c in parse_tool_calls(text)]
    return _model_text(text) == [(marker, piece) for marker, piece in _call_segments(calls) if piece]


def parse_tool_calls(text: str) -> list[ToolCall]:
    """The calls in a `tools` channel's text (markup included, as split_reply keeps it), in order. An
    argument of type `string` is its text; any other type is parsed as JSON (kept as text if it is not)."""
    calls = []
    for m in re.finditer(re.escape(OPEN) + r"call([^<]*?)" + re.escape(SEP) + r"(.*?)(" + re.escape(CLOSE + "call" + SEP)
                         + r"|$)", text, re.DOTALL):
        attrs, body, closed = dict(_ATTR.findall(m.group(1))), m.group(2), bool(m.group(3))
        arguments: dict = {}
        whole = re.search(re.escape(OPEN) + "json" + re.escape(SEP) + r"(.*?)" + re.escape(CLOSE + "json" + SEP), body,
                          re.DOTALL)
        if whole:
            try:
                value = json.loads(whole.group(1))
                arguments = value if isinstance(value, dict) else {"value": value}
            except json.JSONDecodeError:
                arguments = {"_raw": whole.group(1)}
        for a in re.finditer(re.escape(OPEN) + r"argument([^<]*?)" + re.escape(SEP) + r"(.*?)"
                             + re.escape(CLOSE + "argument" + SEP), body, re.DOTALL):
            a_attrs, value = dict(_ATTR.findall(a.group(1))), a.group(2)
            if a_attrs.get("type", "string") != "string":
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    pass
            if "key" in a_attrs:
                arguments[a_attrs["key"]] = value
        calls.append(ToolCall(attrs.get("tool", ""), arguments, closed))
    return calls


def forced_tool_prefix(mode: str, name: str | None = None) -> list[tuple[bool, str]]:
    """What to append to a generation prompt so the reply is a tool call: close the channel the prefix
    opened (and an empty response), open `tools`, and with `name` the call to that tool."""
    channel = _check_mode(mode)
    segs = [(True, CLOSE), (False, channel), (True, SEP)]
    if channel == "think":
        segs += _element("response", "")
    segs += [(True, OPEN), (False, "tools"), (True, SEP)]
    if name is not None:
        segs += [(True, OPEN), (False, f'call tool="{name}" index="1"'), (True, SEP)]
    return segs


class Conversation:
    """A chat in progress: messages plus a mode. `prompt()` -> ids to generate from (stop at
    `stop_ids`), `add_reply(generated ids)` records the answer with its thinking kept."""

    def __init__(self, tokenizer, mode: str = "instruct", system: str | None = None):
        _check_mode(mode)
        self.tokenizer, self.mode = tokenizer, mode
        self.messages: list[dict] = [] if system is None else [{"role": "system", "content": system}]

    @property
    def stop_ids(self) -> set[int]:
        return {self.tokenizer.id_of(EOM)}

    def add_user(self, text: str) -> None:
        self.messages.append(normalize([{"role": "user", "content": text}])[0])

    def add_tool_result(self, text: str, name: str | None = None) -> None:
        self.messages.append(normalize([{"role": "tool", "content": text, "name": name}])[0])

    def prompt(self) -> list[int]:
        return render(self.messages, self.tokenizer, self.mode, own_replies=True)

    def add_reply(self, ids: Sequence[int]) -> Reply:
        reply = split_reply(ids, self.tokenizer, self.mode)
        self.messages.append(reply.message())
        return reply
