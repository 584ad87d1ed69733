"""Structured output: a reply held to a JSON schema, or a forced tool call held to its tool's declared
arguments, by a mask on the logits (issue 25; docs/STRUCTURED-OUTPUT.md says why llguidance does the matching).

A `Grammar` is Lark text in llguidance's dialect, where k3's four chat markers are written as special tokens
(`<|close|>`); it is checked once against a tokenizer's vocabulary, and `grammar.constraint()` is one
generation's matcher. The Sampler sets the logit of every id the constraint does not allow next to -inf
before any of its own filters, then tells the constraint the id it picked (sampling.py). The mask depends
only on the ids picked so far, so a constrained reply has the same ids at every budget, on every backend
and thread count, alone or in a batch, with or without drafts: a drafted id the mask refuses is never
picked, and `Constraint.drafts` cuts a draft to what the grammar allows before a verify pass forwards it.

The grammar a reply gets (`reply_grammar`, `tool_call_grammar`):
- raw text (no chat channel): the JSON value, then a stop id;
- a chat reply whose generation prefix opened `response`: the JSON, `<|close|>response<|sep|>`, a stop id;
- one that opened `think`: free thinking text first, then `<|open|>response<|sep|>` and the above;
- with tools offered and `tool_choice` auto, the same reply may instead be an empty response and a `tools`
  channel of calls (without a schema: any text, then optionally calls, which is constrained only when parallel
  calls are off); a forced call (after forced_tool_prefix) is the calls alone. Each call holds one `json`
  element whose JSON satisfies that tool's `parameters`; at most MAX_CALLS calls, or one.
JSON is written one way: `, ` and `: ` between items and no other whitespace, so a reply cannot run on in
blank space. Once the grammar is complete only the stop id is allowed: `<|end_of_msg|>` in chat, `[EOS]` after
raw text (`Constraint.stop_ids`); generation ends there, so a reply that stops satisfies its grammar.

What cannot be enforced is a SchemaError before generation: what llguidance refuses at compile, a schema with no
finite instance or a pattern its lexer cannot build (schema_checks.py), and a grammar whose first ids (those it
forces) already fail. If the grammar engine still fails mid-reply, `Constraint` raises GrammarError for that
reply alone: its mask is never the stop id it falls back to.
"""
from __future__ import annotations

import json
import logging
import weakref
from typing import Mapping, Sequence

import numpy as np

from ..errors import K3Error, UsageError
from ..text.chat import EOM
from .schema_checks import engine_message, no_finite_instance, pattern_problem, patterns

log = logging.getLogger("k3.structured")

MAX_SCHEMA_BYTES = 64 << 10  # a JSON schema's text, at most (compiling costs grow with it)
MAX_CALLS = 8                # tool calls in one constrained tools channel, at most
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
ANY_OBJECT = {"type": "object"}  # json_object, and a tool declared without parameters
RAW_STOP = "[EOS]"
PROBE_IDS = 64               # ids a grammar forces at its start, at most, that are checked before generation


class SchemaError(UsageError):
    """A schema or grammar that cannot be enforced; `param` names where it came from (a request field)."""

    def __init__(self, param: str, problem: str):
        super().__init__(f"{param}: {problem}")
        self.param, self.problem = param, problem


class GrammarError(K3Error):
    """The grammar engine stopped mid-reply (a limit passed while it built what comes next): the reply cannot go on
    under its grammar. `reason` is llguidance's first line, `detail` its whole message (its state: for a debug log),
    `ids` the ids the reply had when it stopped."""

    def __init__(self, detail: str, ids: int):
        self.reason, self.detail, self.ids = engine_message(detail), detail, ids
        super().__init__(f"structured output: the grammar engine stopped after {ids} ids of the reply: {self.reason}")


def schema_text(schema, param: str = "json_schema") -> str:
    """A JSON schema (a dict, or its JSON text) as compact JSON text with its keys in the given order (the
    order properties are generated in); a SchemaError unless it is a JSON object within MAX_SCHEMA_BYTES."""
    if isinstance(schema, str):
        if len(schema.encode()) > MAX_SCHEMA_BYTES:
            raise SchemaError(param, f"the schema is over {MAX_SCHEMA_BYTES} bytes (MAX_SCHEMA_BYTES)")
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise SchemaError(param, f"not JSON: {exc}") from None
    if not isinstance(schema, Mapping):
        raise SchemaError(param, f"a JSON schema must be a JSON object, got {type(schema).__name__}")
    try:
        text = json.dumps(schema, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise SchemaError(param, f"not JSON-serialisable: {exc}") from None
    if len(text.encode()) > MAX_SCHEMA_BYTES:
        raise SchemaError(param, f"the schema is over {MAX_SCHEMA_BYTES} bytes (MAX_SCHEMA_BYTES)")
    check_schema(schema, param)
    return text


def check_schema(schema: Mapping, param: str) -> None:
    """A SchemaError naming `param` for what llguidance compiles and then fails on (schema_checks.py): a $ref
    recursion with no finite instance, a pattern its lexer cannot build."""
    problem = no_finite_instance(schema)
    if problem:
        raise SchemaError(param, problem)
    for where, regex in patterns(schema):
        problem = pattern_problem(regex)
        if problem and "too many expressions" in problem:
            raise SchemaError(param, f"the pattern at {where} is too large to enforce: {_lexer_limit(problem)}")
        if problem:
            raise SchemaError(param, f"the pattern at {where} cannot be enforced: {problem}")


def _lexer_limit(reason: str) -> str:
    """llguidance's lexer giving up, with the limit it passed."""
    import llguidance

    return (f"llguidance's lexer gives up building it ({reason}; its limit, initial_lexer_fuel, is "
            f"{llguidance.LLParserLimits().initial_lexer_fuel:,})")


def _json_rule(name: str, schema: str) -> str:
    """A Lark rule holding JSON that satisfies `schema` (JSON text), in k3's one JSON style."""
    options = {**json.loads(schema), "x-guidance": JSON_STYLE}  # k3's style wins over a schema's own
    return f"{name}: %json {json.dumps(options, ensure_ascii=False)}\n"


def _quoted(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)  # a Lark string literal is a JSON string


def _element(tag: str, body: str) -> str:
    """`<|open|>tag<|sep|> body <|close|>tag<|sep|>` with the tag's words as text (its tokens are the model's)."""
    return f'<|open|> {_quoted(tag)} <|sep|> {body} <|close|> {_quoted(tag.split()[0])} <|sep|>'


def _call_tag(name: str, index: int) -> str:
    return f'call tool="{name}" index="{index}"'  # as tool_call_markup writes it


def _calls_rules(tools: Sequence[Mapping], first_open: bool, max_calls: int) -> str:
    """Rules `calls` (1..max_calls calls, indexed from 1) and one `args_J` per tool. `first_open`: the first
    call's opening is already in the prompt (a named tool forced), so only its arguments are generated."""
    if not tools:
        raise SchemaError("tools", "a tool call was forced, but no tools are declared")
    rules = "".join(_json_rule(f"args_{j}", schema_text(t.get("parameters") or ANY_OBJECT,
                                                            f"tools[{j}].parameters")) for j, t in enumerate(tools))
    body = _element("json", "{args}") + f" <|close|> {_quoted('call')} <|sep|>"
    if first_open:
        rules += "calls: " + body.format(args="args_0") + "\n"
        return rules
    for i in range(1, max_calls + 1):
        rules += f"call_{i}: " + " | ".join(
            f"<|open|> {_quoted(_call_tag(t['name'], i))} <|sep|> " + body.format(args=f"args_{j}")
            for j, t in enumerate(tools)) + "\n"
    nested = "".join(f" (call_{i}" for i in range(2, max_calls + 1)) + ")?" * (max_calls - 1)
    return rules + f"calls: call_1{nested}\n"


def tool_call_grammar(tools: Sequence[Mapping], name: str | None = None, max_calls: int = MAX_CALLS) -> str:
    """Lark for the rest of a reply whose prompt ends with forced_tool_prefix(mode, name): 1..max_calls calls,
    each holding JSON that satisfies its tool's `parameters`, then the tools channel's close. `tools`: the
    declarations ({name, parameters?}); with `name`, the call to that tool (already opened) alone."""
    if name is not None:
        tools = [t for t in tools if t.get("name") == name]
        if not tools:
            raise SchemaError("tool_choice", f"no declared tool is named {name!r}")
    return ("start: calls " + f"<|close|> {_quoted('tools')} <|sep|>\n"
            + _calls_rules(tools, name is not None, max_calls))


def reply_grammar(schema: str | None, channel: str | None, tools: Sequence[Mapping] = (), max_calls: int = MAX_CALLS
                  ) -> str:
    """Lark for a reply whose prompt ends with the generation prefix that opened `channel` ("response",
    "think", or None for raw text). With a `schema` (JSON text), the response is JSON satisfying it, or, when
    `tools` are offered (auto choice), empty and followed by a tools channel of 1..max_calls calls to them.
    Without one, the response is any text, optionally followed by such a tools channel."""
    if channel is None:
        if tools:
            raise UsageError("tool calls are constrained in chat replies only (a chat channel is needed)")
        return "start: reply\n" + _json_rule("reply", schema)
    if channel not in ("response", "think"):
        raise UsageError(f"a constrained reply starts in the response or think channel, not {channel!r}")
    end_response = f"<|close|> {_quoted('response')} <|sep|>"
    calls = f"<|open|> {_quoted('tools')} <|sep|> calls <|close|> {_quoted('tools')} <|sep|>"
    if schema is not None:
        rules, answer = _json_rule("reply", schema), f"reply {end_response}"
        if tools:
            answer = f"({answer} | {end_response} {calls})"
    else:
        rules, answer = "", f"TEXT? {end_response}" + (f" ({calls})?" if tools else "")
    if tools:
        rules += _calls_rules(tools, False, max_calls)
    if channel == "think":
        answer = f"TEXT? <|close|> {_quoted('think')} <|sep|> <|open|> {_quoted('response')} <|sep|> {answer}"
    return f"start: {answer}\n{rules}TEXT: /(?s:.+)/\n"


class _Vocabulary:
    """llguidance's view of one tokenizer, with the one stop id that ends a complete reply (building it takes
    ~1 s for K3's 163,840 ids: kept per tokenizer and stop token)."""

    _built: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()

    def __init__(self, tokenizer, stop: str):
        import llguidance

        self.stop_ids = (tokenizer.id_of(stop),)
        self.n_vocab = tokenizer.vocab_size
        self.lltokenizer = llguidance.LLTokenizer.from_tiktoken(
            encoder=tokenizer.ranks, special_tokens=tokenizer.added_tokens, pattern=tokenizer.pat_str,
            eos_token=self.stop_ids[0], n_vocab=self.n_vocab)

    @classmethod
    def of(cls, tokenizer, chat: bool) -> "_Vocabulary":
        """A chat reply ends with `<|end_of_msg|>`; raw text with `[EOS]` where the tokenizer has it."""
        stop = EOM if chat or RAW_STOP not in tokenizer.added_tokens else RAW_STOP
        built = cls._built.setdefault(tokenizer, {})
        if stop not in built:
            built[stop] = cls(tokenizer, stop)
        return built[stop]


class Grammar:
    """Lark text checked against `tokenizer`'s vocabulary; a SchemaError naming `param` if it cannot be
    enforced (a JSON Schema keyword llguidance does not implement is refused, never ignored). `chat`: the
    reply ends with `<|end_of_msg|>` (else with `[EOS]`, raw text's stop)."""

    def __init__(self, tokenizer, lark: str, param: str = "json_schema", chat: bool = True):
        import llguidance

        self.vocab = _Vocabulary.of(tokenizer, chat)
        self.lark, self.stop_ids = lark, self.vocab.stop_ids
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, self.vocab.lltokenizer)
        if failed:
            raise SchemaError(param, "cannot be enforced: " + engine_message(messages[0]))
        self._compiled = llguidance.LLMatcher(self.vocab.lltokenizer, grammar, log_level=0)
        if self._compiled.is_error():
            raise SchemaError(param, "cannot be enforced: " + engine_message(self._compiled.get_error()))
        self._probe(param)

    def _probe(self, param: str) -> None:
        """The first masks, while the grammar forces one id (up to PROBE_IDS): a SchemaError if one fails or allows
        nothing, which a reply would otherwise meet at its first id."""
        matcher = self._compiled.deep_copy()
        for _ in range(PROBE_IDS):
            bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), np.uint8), bitorder="little")
            if matcher.is_error():
                log.debug("the grammar fails at its start: %s", matcher.get_error())
                reason = engine_message(matcher.get_error())
                raise SchemaError(param, "cannot be enforced: " + (
                    "its patterns are too large together: " + _lexer_limit(reason)
                    if "too many expressions" in reason else reason))
            allowed = np.flatnonzero(bits[:self.vocab.n_vocab])
            if len(allowed) == 0:
                raise SchemaError(param, "cannot be enforced: no reply satisfies it")
            if len(allowed) > 1 or int(allowed[0]) in self.stop_ids:
                return
            matcher.consume_token(int(allowed[0]))

    def constraint(self) -> "Constraint":
        return Constraint(self._compiled.deep_copy(), self.vocab)


class Constraint:
    """One generation's matcher: `allowed` ids next, `advance` by the id picked. Once a stop id is picked the
    constraint is `finished` and allows everything (a batch may pick past a stop; those ids are discarded)."""

    def __init__(self, matcher, vocab: _Vocabulary):
        self.matcher, self.stop_ids = matcher, vocab.stop_ids
        self.n_vocab = vocab.n_vocab
        self.finished = False
        self.ids = 0  # consumed so far

    def allowed(self, size: int) -> np.ndarray:
        """bool [size]: the ids the grammar allows next (ids past the tokenizer's vocabulary never are); GrammarError
        when the engine failed (its mask would then allow the stop id alone, ending an unfinished reply)."""
        bits = np.unpackbits(np.frombuffer(self.matcher.compute_bitmask(), np.uint8), bitorder="little")
        if self.matcher.is_error():
            raise GrammarError(self.matcher.get_error(), self.ids)
        out = np.zeros(size, bool)
        n = min(size, self.n_vocab)
        out[:n] = bits[:n]
        return out

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """`logits` with every id the grammar does not allow next at -inf (a copy; unchanged once finished)."""
        if self.finished:
            return logits
        return np.where(self.allowed(logits.shape[-1]), logits, -np.inf)

    def advance(self, token: int) -> None:
        if self.finished:
            return
        if not self.matcher.consume_token(int(token)):  # the mask allowed it: the engine failed consuming it
            raise GrammarError(self.matcher.get_error(), self.ids)
        self.ids += 1
        self.finished = token in self.stop_ids

    def drafts(self, ids: list[int], k: int) -> list[int]:
        """What a verify pass should check after the ids picked so far, at most `k`: the ids the grammar
        forces next (a JSON key, the closing markup: the mask will pick them), else the longest prefix of the
        drafted `ids` the grammar allows."""
        if self.finished:
            return ids
        forced = self.matcher.compute_ff_tokens()
        if forced:
            return [int(t) for t in forced[:k]]
        return ids[:self.matcher.validate_tokens(ids)]


def chat_grammar(tokenizer, channel: str, *, schema: str | None = None, schema_param: str = "json_schema",
                 tools: Sequence[Mapping] = (), tool_choice: str | None = None, parallel_calls: bool = True
                 ) -> Grammar | None:
    """The grammar a chat reply gets, or None when nothing constrains it. `tool_choice` "required" or a tool's
    name forces the calls (the prompt must end with forced_tool_prefix); otherwise a `schema` (JSON text)
    holds the response, and `tools` offered under "auto" may be called instead; up to MAX_CALLS calls, or one
    without `parallel_calls` (which alone constrains a reply offered tools). A part that cannot be
    enforced is a SchemaError naming it: `schema_param`, or `tools[J].parameters`."""
    forced, max_calls = tool_choice not in (None, "auto", "none"), MAX_CALLS if parallel_calls else 1
    offered = tools if tool_choice != "none" else ()
    if not forced and schema is None and (parallel_calls or not offered):
        return None
    if forced:
        lark = tool_call_grammar(tools, None if tool_choice == "required" else tool_choice, max_calls)
        param = "tool_choice"
    else:
        lark, param = reply_grammar(schema, channel, offered, max_calls), schema_param
    try:
        return Grammar(tokenizer, lark, param)
    except SchemaError:
        for j, tool in enumerate(tools):  # name the tool whose parameters failed, when one did
            where = f"tools[{j}].parameters"
            Grammar(tokenizer, "start: args\n" + _json_rule("args", schema_text(tool.get("parameters") or ANY_OBJECT,
                                                                                 where)), where)
        raise
