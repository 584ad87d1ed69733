"""Chat: messages -> prompt ids in K3's XTML structure (SPEC §7), and a generated reply -> its parts.

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
works); drop it and it is not shown. No `[BOS]`: SPEC §7 adds none to raw prompts, and the opening
`<|open|>` already marks the start (a checkpoint template may still emit `bos_token`).

Two paths, same ids. With `chat_template` in tokenizer_config.json, it is rendered in a jinja2
ImmutableSandboxedEnvironment(trim_blocks, lstrip_blocks) with: `messages` (normalised: `role`,
`content` str, plus `thinking` / `tools` / `name` only when given), `add_generation_prompt`,
`mode`, `thinking` and `enable_thinking` (bools), `bos_token`, `eos_token` (`<|end_of_msg|>`),
`raise_exception(msg)`, filter `tojson`; the text is encoded with special tokens allowed. Since
markup typed into a message would then become real markup, that path refuses such text unless
`allow_markup_in_text=True`. Without a template, the builder assembles ids itself: markers by id,
each text run between markers by `tokenizer.encode(run)` with specials NOT allowed.
`CHAT_TEMPLATE` renders exactly what the builder builds (tests/test_chat.py checks both).
"""
from __future__ import annotations

import json
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


def _element(tag: str, body: str, attrs: str = "") -> list[tuple[bool, str]]:
    return [(True, OPEN), (False, tag + attrs), (True, SEP), (False, body), (True, CLOSE), (False, tag), (True, SEP)]


def segments(messages, mode: str = "instruct", add_generation_prompt: bool = True) -> list[tuple[bool, str]]:
    """The conversation as (is_marker, text) pieces; joined, they are the markup string."""
    channel = _check_mode(mode)
    segs: list[tuple[bool, str]] = []
    for m in normalize(messages):
        if m["role"] == "assistant":
            if "thinking" in m:
                segs += _element("think", m["thinking"])
            segs += _element("response", m["content"])
            if "tools" in m:
                segs += _element("tools", m["tools"])
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
                    bos_token: str = "") -> str:
    """The template's text for these messages (the variables are listed in the module docstring)."""
    from jinja2 import TemplateError

    _check_mode(mode)
    try:
        return _compile(template).render(
            messages=normalize(messages), add_generation_prompt=add_generation_prompt, mode=mode,
            thinking=mode == "thinking", enable_thinking=mode == "thinking", bos_token=bos_token, eos_token=EOM)
    except TemplateError as exc:
        raise CheckpointError(f"tokenizer_config.json: chat_template failed to render: {exc}") from None


def render(messages, tokenizer, mode: str = "instruct", *, add_generation_prompt: bool = True,
           use_template: bool = True, allow_markup_in_text: bool = False) -> list[int]:
    """Prompt ids for `messages`: the checkpoint's chat_template if it has one (and use_template), else the builder."""
    template = chat_template(tokenizer) if use_template else None
    if template is None:
        return build_ids(tokenizer, segments(messages, mode, add_generation_prompt))
    if not allow_markup_in_text:  # what people typed; the model's own replies are its tokens, not input
        for i, m in enumerate(normalize(messages)):
            if m["role"] == "assistant":
                continue
            for k, v in m.items():
                if k != "role" and tokenizer.encode(v, allow_special=True) != tokenizer.encode(v):
                    raise UsageError(f"message {i} ({m['role']}): {k!r} contains special-token text, which the "
                                     "chat template would turn into markup (pass allow_markup_in_text=True to allow)")
    try:
        bos = "[BOS]" if tokenizer.id_of("[BOS]") is not None else ""
    except (LookupError, ValueError, K3Error):
        bos = ""
    return tokenizer.encode(render_template(template, messages, mode, add_generation_prompt, bos), allow_special=True)


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
        return render(self.messages, self.tokenizer, self.mode)

    def add_reply(self, ids: Sequence[int]) -> Reply:
        reply = split_reply(ids, self.tokenizer, self.mode)
        self.messages.append(reply.message())
        return reply
