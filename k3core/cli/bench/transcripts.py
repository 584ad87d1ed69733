"""`k3 bench drafts --transcripts FILE.jsonl`: how many ids per forward pass draft sources would give on recorded
conversations, without running the model.

Each line of FILE is one conversation, {"messages": [...], "kind": "..."} ("kind" optional), in OpenAI's chat
shape: system/developer, user, assistant (content, tool_calls, reasoning_content) and tool messages. Every
assistant turn is scored. Its prompt is the messages before it rendered as the server renders a chat request
(instruct mode, with the generation prefix); its ids are what rendering the turn adds to the messages before it
(its channels and <|end_of_msg|>, tool calls included).

Teacher forcing is exact here because an exact engine's ids never depend on its drafts: the model would emit the
recorded ids whatever was proposed, so only the number of passes changes. The prompt's pass yields the first id;
before each verify pass the draft source proposes up to K ids after the prompt and the ids so far, the accepted
ones are the longest common prefix with the recorded continuation, and the pass yields those plus the model's
own next id. Tokens per pass = the turn's ids / its passes (1.00 is serial decoding). K "auto" is --speculate
auto's adaptive length (k3core.generation.generate.DraftLength).

Sources see the file as a server sees its requests: a fresh source per turn (begin, propose, end), turns in file
order, so one that learns across requests has learnt the conversations before the turn. Each (source, K) runs in
its own process, so none has learnt a turn from another K's run of it.

Each kind's census also counts the prompt side of its turns as an agent loop with a prompt cache sends them: a
turn's new prompt ids are those its conversation did not already hold (the first turn's whole prompt, a later
turn's prompt past the previous turn's prompt and reply), `prompt_ids` their total over the kind's turns, and
`context_ids` the total of the ids before them (context_ids / turns: where a mean turn's new ids start).

The ids are MODEL_DIR's tokenizer's, or --tokenizer's (bench_tokenizer.py: e.g. a real-sized BPE where the model is
the demo one, whose 768 ids overstate acceptance). `python -m k3core.cli.bench.transcripts FILE.json` prints the
table of a --json document.
"""
from __future__ import annotations

import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

from ...errors import UsageError
from ...text.openai_messages import MessageError, k3_messages

KS = ("1", "2", "4", "8", "auto")
DEFAULT_SOURCES = "ngram,suffix"
TRANSCRIPTS_BYTES = 64 << 20  # a transcripts file is read whole
UNLABELLED = "unlabelled"  # the kind of a conversation without one


# ---- reading: JSONL -> k3 chat messages, as the server reads a request's (k3core/text/openai_messages.py) ---

@dataclass(frozen=True)
class Conversation:
    line: int
    kind: str
    messages: list  # k3 chat messages (role, content, thinking, tools, name)


class BadLine(UsageError):
    def __init__(self, path, line: int, field: str, problem: str):
        super().__init__(f"{path} line {line}: {field}: {problem}")


def read_conversations(path) -> list[Conversation]:
    """The conversations of a JSONL file; a line that is not one is refused, naming it and the field."""
    from ...files.limits import loads_limited, read_limited

    try:
        text = read_limited(path, TRANSCRIPTS_BYTES, "a transcripts file").decode("utf-8")
    except OSError as exc:
        raise UsageError(f"--transcripts {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError as exc:
        raise UsageError(f"--transcripts {path}: not UTF-8 ({exc.reason} at byte {exc.start})") from None
    out = []
    for number, line in enumerate(text.split("\n"), start=1):  # not splitlines: JSON text may hold U+2028
        if not line.strip():
            continue
        try:
            doc = loads_limited(line, f"{path} line {number}")
        except json.JSONDecodeError as exc:
            raise BadLine(path, number, "the line", f"not JSON ({exc.msg} at column {exc.colno})") from None
        out.append(parsed_line(path, number, doc))
    if not out:
        raise UsageError(f"--transcripts {path}: no conversations in it")
    return out


def parsed_line(path, number: int, doc) -> Conversation:
    if not isinstance(doc, dict):
        raise BadLine(path, number, "the line", f"must be a JSON object, got {type(doc).__name__}")
    kind = doc.get("kind", UNLABELLED)
    if not isinstance(kind, str) or not kind:
        raise BadLine(path, number, "kind", "must be a non-empty string")
    try:
        return Conversation(number, kind, k3_messages(doc.get("messages")))
    except MessageError as exc:
        raise BadLine(path, number, exc.param, exc.problem) from None


# ---- rendering: the scored turns -------------------------------------------------------------------------------

@dataclass(frozen=True)
class Turn:
    kind: str
    prompt: tuple[int, ...]
    reply: tuple[int, ...]  # the ids the model would emit, <|end_of_msg|> included
    cached: int = 0  # the prompt's first ids its conversation already held (scored_turns; 0: none known)


def scored_turns(conversations: list[Conversation], tokenizer, path) -> list[Turn]:
    """Every assistant turn of every conversation, in file order."""
    from ...text.chat import render as render_chat

    out = []
    for c in conversations:
        held = ()  # the conversation's ids so far: its previous turn's prompt and reply
        for i, m in enumerate(c.messages):
            if m["role"] != "assistant":
                continue
            try:
                prompt = render_chat(c.messages[:i], tokenizer, "instruct")
                whole = render_chat(c.messages[:i + 1], tokenizer, "instruct", add_generation_prompt=False)
            except UsageError as exc:
                raise UsageError(f"{path} line {c.line}: {exc}") from None
            if whole[:len(prompt)] != prompt or len(whole) == len(prompt):
                raise UsageError(f"{path} line {c.line}: messages[{i}]: the chat template does not render the turn as "
                                 "the generation prefix and a continuation of it; its ids cannot be told apart")
            # a chat template may render earlier messages otherwise once more follow (e.g. drop their thinking): the
            # ids past the longest common prefix are new then, as a prompt cache would find them
            out.append(Turn(c.kind, tuple(prompt), tuple(whole[len(prompt):]), common_prefix(held, prompt)))
            held = whole
    return out


# ---- teacher-forced acceptance ---------------------------------------------------------------------------------

@dataclass
class Counts:
    turns: int = 0
    ids: int = 0
    passes: int = 0
    proposed: int = 0
    accepted: int = 0

    def add(self, other: "Counts") -> None:
        for k in vars(self):
            setattr(self, k, getattr(self, k) + getattr(other, k))

    def summary(self) -> dict:
        return {**vars(self), "tokens_per_pass": self.ids / self.passes if self.passes else None,
                "acceptance": self.accepted / self.proposed if self.proposed else None}


def draft_length(k: str, cost):
    """K's draft length; auto weighs drafts by `cost` (a PassCost: the model's bytes, its routing's unions unseen)."""
    from ...generation.generate import AUTO_K, DraftLength
    return DraftLength(AUTO_K, adaptive=True, cost=cost) if k == "auto" else DraftLength(int(k), adaptive=False)


def common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def walk(source, turn: Turn, k: str, vocab: int, cost=None) -> Counts:
    """One turn decoded against its recorded ids with `source`'s drafts: passes, proposed and accepted ids."""
    from ...generation.generate import proposals

    length, reply = draft_length(k, cost), turn.reply
    source.begin(turn.prompt)
    history = [*turn.prompt, reply[0]]  # the prompt's pass yields the first id
    passes, proposed, accepted = 1, 0, 0
    while (done := len(history) - len(turn.prompt)) < len(reply):
        n = length.next()
        drafted = proposals(source, history, done, n, vocab) if n else []
        right = common_prefix(drafted, reply[done:done + len(drafted)])
        if drafted:
            length.update(len(drafted), right)
        history += reply[done:done + right + 1]  # the drafted ids the model agrees with, then its own
        passes, proposed, accepted = passes + 1, proposed + len(drafted), accepted + right
    source.end(tuple(history))
    return Counts(1, len(reply), passes, proposed, accepted)


def acceptance(turns: list[Turn], make_source, k: str, vocab: int, cost=None) -> tuple[Counts, dict[str, Counts]]:
    """Counts over all turns and per kind, with a fresh `make_source()` for each turn, turns in order."""
    total, by_kind = Counts(), {}
    for turn in turns:
        counts = walk(make_source(), turn, k, vocab, cost)
        by_kind.setdefault(turn.kind, Counts()).add(counts)
        total.add(counts)
    return total, by_kind


def run_job(job: tuple) -> dict:
    """One (source, K) over the turns, in a process of its own: {"all": summary, "by_kind": {kind: summary}}."""
    from ...api import draft_source

    spec, k, turns, vocab, cost = job
    total, by_kind = acceptance(turns, lambda: draft_source(spec), k, vocab, cost)
    return {"all": total.summary(), "by_kind": {kind: c.summary() for kind, c in by_kind.items()}}


def isolated(job: tuple) -> dict:
    with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as one:
        return one.submit(run_job, job).result()


def run_all(specs: list[str], turns: list[Turn], vocab: int, cost, at_once: int | None = None
            ) -> dict[str, dict[str, dict]]:
    """{spec: {K: run_job's result}}, each (spec, K) in a fresh process, `at_once` at a time (default: the cores)."""
    jobs = [(spec, k, turns, vocab, cost) for spec in specs for k in KS]
    results: dict[str, dict[str, dict]] = {spec: {} for spec in specs}
    started = time.perf_counter()
    with ThreadPoolExecutor(max(1, min(len(jobs), at_once or os.cpu_count() or 1))) as pool:
        for (spec, k, *_), result in zip(jobs, pool.map(isolated, jobs)):
            results[spec][k] = result
            print(f"  {spec} K={k}: {result['all']['tokens_per_pass']:.3f} tokens per pass "
                  f"({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    return results


# ---- the command -----------------------------------------------------------------------------------------------

def pass_cost(model):
    """What `auto` weighs drafts by: the model's pass bytes (its checkpoint's), unions as independent routing's."""
    from ...format.checkpoint import open_checkpoint
    from ...model.pass_cost import PassCost

    checkpoint = open_checkpoint(model)
    try:
        return PassCost.of_checkpoint(checkpoint)
    finally:
        checkpoint.close()


def source_specs(given: str | None) -> list[str]:
    """The --sources list, each checked to name an installed draft source (one is built to check it)."""
    from ...api import draft_source

    specs = [s.strip() for s in (given or DEFAULT_SOURCES).split(",") if s.strip()]
    if not specs:
        raise UsageError("--sources: name at least one draft source, e.g. --sources ngram")
    for spec in specs:
        draft_source(spec)  # an unknown name is a PluginError naming it and the installed ones
    return specs


def document(model, path, conversations, turns, results, tokenizer: dict) -> dict:
    from .tokenizer import shown

    kinds = sorted({t.kind for t in turns})
    census = {kind: kind_census(kind, conversations, turns) for kind in kinds}
    sources = {spec: {"tokens_per_pass": {k: runs[k]["all"]["tokens_per_pass"] for k in KS},
                      "by_kind": {kind: {k: runs[k]["by_kind"][kind]["tokens_per_pass"] for k in KS} for kind in kinds},
                      "counts": {k: runs[k] for k in KS}}
               for spec, runs in results.items()}
    return {"model": shown(model), "tokenizer": tokenizer, "transcripts": str(path),
            "conversations": len(conversations), "turns": len(turns), "reply_ids": sum(len(t.reply) for t in turns),
            "kinds": census, "sources": sources}


def kind_census(kind: str, conversations, turns) -> dict:
    """One kind's conversations and turns, its turns' reply ids, their new prompt ids (what their conversation did
    not already hold) and the ids before those."""
    mine = [t for t in turns if t.kind == kind]
    return {"conversations": sum(c.kind == kind for c in conversations), "turns": len(mine),
            "reply_ids": sum(len(t.reply) for t in mine), "prompt_ids": sum(len(t.prompt) - t.cached for t in mine),
            "context_ids": sum(t.cached for t in mine)}


def table(doc: dict) -> str:
    from .tokenizer import label

    whose = label(doc["tokenizer"]) if "tokenizer" in doc else f"the tokenizer of {Path(doc['model']).name}"
    head = "| source | kind | turns | reply ids | " + " | ".join(f"K={k}" if k != "auto" else "auto" for k in KS) + " |"
    rule = "|---|---|---:|---:|" + "---:|" * len(KS)
    lines = [f"draft acceptance on {Path(doc['transcripts']).name}, teacher-forced: {doc['conversations']} "
             f"conversations, {doc['turns']} assistant turns, {doc['reply_ids']} reply ids ({whose})"]
    for title, cell in (("tokens per pass (reply ids / forward passes; 1.00 is serial decoding)",
                         lambda c: f"{c['tokens_per_pass']:.2f}"),
                        ("drafted ids accepted / proposed", accepted_cell)):
        lines += ["", title, "", head, rule]
        for spec, s in doc["sources"].items():
            for kind in [*doc["kinds"], None]:  # None: all kinds
                row = {k: s["counts"][k]["all"] if kind is None else s["counts"][k]["by_kind"][kind] for k in KS}
                lines.append(f"| {spec} | {kind or 'all kinds'} | {row['1']['turns']} | {row['1']['ids']} | "
                             + " | ".join(cell(row[k]) for k in KS) + " |")
    return "\n".join(lines)


def accepted_cell(c: dict) -> str:
    return f"{c['accepted']} / {c['proposed']} ({100 * c['acceptance']:.0f} %)" if c["proposed"] else "0 / 0"


def cmd_transcripts(args) -> int:
    from ...format.notes import demo_model_dir
    from .tokenizer import bench_tokenizer

    model = Path(args.model) if args.model else demo_model_dir()
    if args.jobs is not None and args.jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {args.jobs}")
    specs = source_specs(args.sources)
    tokenizer, whose = bench_tokenizer(args.tokenizer, model)
    conversations = read_conversations(args.transcripts)
    turns = scored_turns(conversations, tokenizer, args.transcripts)
    if not turns:
        raise UsageError(f"--transcripts {args.transcripts}: no assistant turns to score")
    results = run_all(specs, turns, tokenizer.vocab_size, pass_cost(model), args.jobs)
    doc = document(model, args.transcripts, conversations, turns, results, whose)
    print(json.dumps(doc, indent=1) if args.json else table(doc))
    return 0


if __name__ == "__main__":  # the table of a --json document
    if len(sys.argv) != 2:
        sys.exit("usage: python -m k3core.cli.bench.transcripts DRAFTS.json")
    print(table(json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))))
