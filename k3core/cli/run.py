"""`k3 run`: one prompt in — text, or token ids — and the generation streamed out, then a run report.

Text mode tokenizes with the model's tokenizer (or --tok DIR) and streams text; --chat wraps the
prompt as one user turn in the K3 chat format. Id mode prints ids. The report goes to stderr. Standard output and
every output file are checked (a FIFO opened) before the model loads; no two outputs may be one file.
"""
from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import stat
import sys
import time
from dataclasses import replace
from pathlib import Path

from ..api import Observer
from ..errors import UsageError
from ..errors import OutputError
from ..generation.channels import visible
from ..files import device
from ..files.atomic import Output, unwritable, write_output
from ..files.limits import read_limited
from ..format.checkpoint import EXPERT_PARTS, expert_prefix
from .options import (EXIT_CODES, SECONDS, add_engine_arguments, add_prompt_cache_arguments, add_sampling_arguments,
                      add_speculation_arguments, check_stop_ids, draft_name, engine_config_from_args,
                      missing_model_dir, open_engine, parse_ids, prompt_cache_from_args, sampling_params_from_args,
                      speculation_from_args)



def _read(path: str, flag: str) -> str:
    try:
        return read_limited(path, MAX_PROMPT_BYTES, f"a prompt ({flag})").decode("utf-8")
    except OSError as exc:
        raise UsageError(f"{flag} {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{flag} {path}: not UTF-8 text") from None


MAX_PROMPT_BYTES = 4 << 20  # a prompt read from a file or stdin: more is refused, naming the limit


def _stdin_text(stdin) -> str:
    data = stdin.buffer.read(MAX_PROMPT_BYTES + 1) if hasattr(stdin, "buffer") else stdin.read(MAX_PROMPT_BYTES + 1)
    if len(data) > MAX_PROMPT_BYTES:
        raise UsageError(f"the prompt on standard input is over the {MAX_PROMPT_BYTES >> 20} MiB limit of a prompt")
    try:
        return data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        raise UsageError("the prompt on standard input is not UTF-8 text") from None


def _piped(stdin) -> bool:
    """Whether standard input is a pipe or a file (not a terminal, not closed, not a test harness)."""
    import os
    import stat

    try:
        mode = os.fstat(stdin.fileno()).st_mode
    except (AttributeError, OSError, ValueError):
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISREG(mode) or stat.S_ISSOCK(mode)


def _looks_like_a_path(text: str) -> bool:
    return not any(c.isspace() for c in text) and (text.startswith((".", "~")) or "/" in text)


def settle_positionals(args, stdin) -> None:
    """`k3 run [MODEL_DIR] [PROMPT]`: a MODEL_DIR that is no directory but reads like a sentence is the
    prompt (the saved profile's model is used); PROMPT `-`, or no prompt with a pipe on stdin, reads stdin."""
    flags = [args.prompt, args.prompt_file, args.ids, args.ids_file]
    if args.model and not Path(args.model).is_dir():
        if any(f is not None for f in flags) or args.text is not None or _looks_like_a_path(args.model):
            problem = missing_model_dir(args.model)  # with the close directory names, if any
            if "did you mean" not in problem and not _looks_like_a_path(args.model) and all(f is None for f in flags):
                words = shlex.join([f"{args.model} {args.text}"])  # `k3 run hello world`: one prompt, unquoted
                problem += f"; a prompt of several words is one argument: quote it (k3 run {words})"
            raise UsageError(problem)
        args.model, args.text = None, args.model
    if args.text is not None:
        if any(f is not None for f in flags):
            raise UsageError("a prompt given twice: as an argument and with a flag; give exactly one")
        args.prompt = _stdin_text(stdin) if args.text == "-" else args.text
    elif all(f is None for f in flags) and _piped(stdin):
        args.prompt = _stdin_text(stdin)


def prompt_source(args) -> tuple[str, object]:
    """("ids", [ids]) or ("text", str), from exactly one of the four prompt flags."""
    given = [(flag, value) for flag, value in (("--prompt", args.prompt), ("--prompt-file", args.prompt_file),
                                               ("--ids", args.ids), ("--ids-file", args.ids_file)) if value is not None]
    if not given:
        raise UsageError("no prompt: give it as an argument (k3 run 'Hello'), - for standard input, or --prompt "
                         "TEXT, --prompt-file PATH, --ids 1,2,3, --ids-file PATH")
    if len(given) > 1:
        raise UsageError(f"two prompt sources ({given[0][0]} and {given[1][0]}): give exactly one")
    flag, value = given[0]
    if flag.startswith("--ids"):
        ids = parse_ids(value if flag == "--ids" else _read(value, flag), flag)
        if not ids:
            raise UsageError("the prompt is empty: give at least one token id")
        return "ids", ids
    text = value if flag == "--prompt" else _read(value, flag)
    if not text:
        raise UsageError("the prompt is empty")
    return "text", text


class TraceRecorder(Observer):
    """(layer, expert) of every routing decision, written as int32 pairs (the k3-in-c format), with the
    slot bytes the store really uses per expert (what `k3 sim-cache` sizes its caches by)."""

    def __init__(self):
        self.pairs = []

    def on_route(self, layer, expert_ids):
        self.pairs.extend((layer, int(e)) for e in expert_ids.reshape(-1))

    def write(self, directory, engine):
        import numpy as np

        c = engine.config
        expert_bytes = engine.store.stats().get("expert_slot_bytes")
        if not expert_bytes:
            first_moe = min(c.first_k_dense_replace, c.num_hidden_layers - 1)
            expert_bytes = sum(engine.checkpoint.index[expert_prefix(first_moe, 0) + p].nbytes for p in EXPERT_PARTS)
        out = Path(directory)
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(f"--dump-trace {directory}: cannot make the directory: {exc.strerror or exc}") from None
        write_output(out / "expert_trace.bin", np.asarray(self.pairs, "<i4").reshape(-1, 2).tobytes(), "--dump-trace")
        meta = {"tokens": engine.tokens_forwarded, "expert_bytes": expert_bytes, "requests": len(self.pairs),
                "model": str(engine.checkpoint.root), "top_k": c.num_experts_per_token}
        write_output(out / "trace.json", (json.dumps(meta, indent=1) + "\n").encode(), "--dump-trace")


def chats(tokenizer) -> bool:
    """Whether the model is a chat model: a chat_template in tokenizer_config.json, or the chat markup's tokens."""
    from ..text.chat import CLOSE, EOM, OPEN, SEP, chat_template

    return chat_template(tokenizer) is not None or all(m in tokenizer.added_tokens for m in (OPEN, SEP, CLOSE, EOM))


def chat_hint(args, text: str) -> str:
    """The line that tells a raw completion of a chat model how to ask for an answer instead."""
    model = f" {shlex.quote(str(args.model))}" if args.model else ""
    if args.prompt_file is not None:
        prompt = f"--prompt-file {shlex.quote(args.prompt_file)}"
    else:
        prompt = shlex.quote(text) if len(text) <= 60 and text.isprintable() else '"…"'
    return f"k3: this model chats; for an answer try: k3 run{model} --chat {prompt}  (or k3 chat{model})"


def _text_prompt(args, tokenizer, text):
    """(prompt ids, stop ids, channel the generation prefix opened)."""
    if not args.chat:
        return tokenizer.encode(text), (), None
    from ..api import Conversation

    conv = Conversation(tokenizer, "thinking" if args.thinking else "instruct", system=args.system)
    conv.add_user(text)
    return conv.prompt(), tuple(conv.stop_ids), "think" if args.thinking else "response"


class LogitsRecorder(Observer):
    """The logits row of every generated id (--dump-logits)."""

    def __init__(self):
        self.rows = []

    def on_token(self, token, logits):
        self.rows.append(logits)


class DiskWatch(Observer):
    """The disks under the checkpoint and the trunk from the first generated id to the end of the run, the
    stretch the report's s/token covers: bytes they read and how busy they were (k3core/files/device.py)."""

    def __init__(self, paths):
        self.paths, self.first, self.error = [p for p in paths if p], None, None

    def on_token(self, token, logits):
        if self.first is None and self.error is None:
            self.first = self._snapshots()

    def report(self) -> dict:
        """`disk_activity` (a list, one entry per disk), and `disk_activity_error` if the counters could not be
        read: a report line, never a failed run."""
        after = self._snapshots() if self.first is not None else None
        found = device.activity(self.first, after) if after is not None else []
        return {"disk_activity": found, **({"disk_activity_error": self.error} if self.error else {})}

    def _snapshots(self):
        try:
            return device.snapshots(self.paths)
        except (OSError, ValueError) as exc:
            self.error = str(exc)
            return None


def disk_floor(model, report: dict, seconds: float) -> dict:
    """The O_DIRECT read rate of this checkpoint's experts, probed after the run (`k3 bench stream`'s probe),
    and what it makes of the run: bytes read per generated id ÷ that rate, and decode s/token against it."""
    from ..machine.probes import raw_probe

    probe = raw_probe(model, seconds=seconds)
    per = report.get("bytes_read_per_token")
    floor = per / probe["rate"] if per else None
    return {"disk_probe": probe, "disk_floor_seconds_per_token": floor,
            "vs_disk_floor": report["seconds_per_token"] / floor if floor else None}


def read_schema(path: str) -> str:
    """--json-schema FILE as the schema's JSON text (k3core/generation/structured.py schema_text), refused by name."""
    from ..generation.structured import MAX_SCHEMA_BYTES, schema_text

    try:
        text = read_limited(path, MAX_SCHEMA_BYTES, "a JSON schema (--json-schema)").decode("utf-8")
    except OSError as exc:
        raise UsageError(f"--json-schema {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--json-schema {path}: not UTF-8 text") from None
    return schema_text(text, f"--json-schema {path}")


def check_stdout() -> None:
    """The generation goes to standard output: refuse, before anything loads, one that is closed (`k3 run >&-`) or
    open only for reading, where the ids would be lost and the run say 0."""
    if sys.stdout is None:  # Python found descriptor 1 closed at start
        raise UsageError("standard output (stdout) is closed, and the generation is written there: redirect it to a "
                         "file or to /dev/null")
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a descriptor (a test harness's, an embedding program's stream): its own business
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    except OSError:
        flags = None
    if flags is None or flags & os.O_ACCMODE == os.O_RDONLY:
        raise UsageError(f"standard output (stdout) is {'closed' if flags is None else 'open only for reading'}, and "
                         "the generation is written there: redirect it to a file or to /dev/null")


def write_stdout(text: str, out=None, end: str = "") -> None:
    """print() to `out` (stdout by default), flushed; stdout that cannot be written (a full disk, an I/O error) is an
    OutputError naming it and why. A reader gone (`| head -1`) stays BrokenPipeError: main stops quietly."""
    out = sys.stdout if out is None else out
    try:
        print(text, end=end, flush=True, file=out)
    except BrokenPipeError:
        raise
    except OSError as exc:
        if out is not sys.stdout:
            raise
        try:  # what stays buffered would fail again at exit, with a traceback: send it nowhere
            if sys.stdout.fileno() == 1:
                null = os.open(os.devnull, os.O_WRONLY)
                os.dup2(null, 1)
                os.close(null)
        except (OSError, ValueError):
            pass
        raise OutputError(f"standard output (stdout): cannot write the generation: {exc.strerror or exc}") from None


TRACE_FILES = ("expert_trace.bin", "trace.json")


def check_outputs(args) -> dict[str, Output]:
    """Refuse, before anything loads, an output the run could not write (k3core/files/atomic.py Output): a directory,
    a missing or read-only directory for --json / --dump-logits, a FIFO without a reader (opened now, held until the
    write); an existing non-directory, or one that cannot be written into, for --dump-trace; and two outputs that are
    one file (by path, through a link, or by inode). The outputs, by flag, to write and close."""
    outputs: dict[str, Output] = {}
    try:
        for flag, path in (("--json", args.json), ("--dump-logits", args.dump_logits)):
            if path:
                outputs[flag] = Output(path, flag)
        trace = args.dump_trace
        if trace and Path(trace).exists() and not Path(trace).is_dir():
            raise UsageError(f"--dump-trace {trace}: not a directory (the trace is two files written into DIR)")
        if trace and (why := unwritable(trace)):
            raise UsageError(f"--dump-trace {trace}: cannot write there: {why}")
        named = [(f"{flag} {out.path}", out.path, out.through and (out.stream is not None or _device(out.path)))
                 for flag, out in outputs.items()]
        named += [(f"--dump-trace {trace} (its {name})", Path(trace) / name, _device(Path(trace) / name))
                  for name in (TRACE_FILES if trace else ())]
        for i, (a, path_a, shared_a) in enumerate(named):
            for b, path_b, shared_b in named[i + 1:]:
                if not (shared_a and shared_b) and _same_file(path_a, path_b):
                    raise UsageError(f"{a} and {b} are one file: the later write would replace the earlier; give "
                                     "each output its own path")
    except BaseException:
        for out in outputs.values():
            out.close()
        raise
    return outputs


def _device(path) -> bool:
    """A character device (/dev/null): outputs may share one."""
    try:
        return stat.S_ISCHR(os.stat(path).st_mode)
    except OSError:
        return False


def _same_file(a, b) -> bool:
    """Whether two paths name one file: the same path once links resolve (a file not made yet), or the same inode."""
    try:
        return os.path.realpath(a) == os.path.realpath(b) or os.path.samefile(a, b)
    except OSError:
        return False


def checked_params(args, kind: str):
    """The sampling parameters the flags ask for, once every flag that does not fit the prompt's kind (text or
    ids) or another flag is refused, before anything loads."""
    if (args.chat or args.thinking or args.system) and kind != "text":
        raise UsageError("--chat, --thinking and --system need a text prompt (--prompt or --prompt-file)")
    if args.thinking and not args.chat:
        raise UsageError("--thinking is a chat mode: add --chat")
    params = sampling_params_from_args(args)
    if args.json_schema:
        if kind != "text":
            raise UsageError("--json-schema needs a text prompt: the schema is matched against the reply's text")
        params = replace(params, json_schema=read_schema(args.json_schema))
    if args.full_recompute and args.speculate:
        raise UsageError("--speculate and --full-recompute do not combine: full recompute forwards every id alone")
    return params


def print_events(events, kind: str):
    """Print a generation as it streams — the reply on stdout, thinking on stderr, ids as one line at the end for an
    ids prompt — and return its "done" event. Thinking reads apart from the answer without colour: a 'thinking:'
    line over it and, once the answer starts, a blank line and 'answer:' (both on stderr, so stdout is the answer)."""
    label, done = None, None  # the label printed last
    for event in events:
        if event.kind == "text" and kind == "text":
            think = event.channel == "think"
            if (think and label != "thinking:") or (not think and label == "thinking:"):
                print(("\n\n" if label else "") + ("thinking:" if think else "answer:"), file=sys.stderr, flush=True)
                label = "thinking:" if think else "answer:"
            out = sys.stderr if think else sys.stdout
            write_stdout(visible(event.text) if out.isatty() else event.text, out)
        elif event.kind == "done":
            done = event
    write_stdout(" ".join(str(t) for t in done.ids) if kind == "ids" else "", end="\n")
    return done


def cmd_run(args) -> int:
    check_stdout()
    settle_positionals(args, sys.stdin)
    config = engine_config_from_args(args)
    kind, prompt = prompt_source(args)
    params = checked_params(args, kind)
    speculate = speculation_from_args(args)
    outputs = check_outputs(args)
    try:
        return _run(args, config, kind, prompt, params, speculate, outputs)
    finally:
        for out in outputs.values():
            out.close()


def _run(args, config, kind, prompt, params, speculate, outputs) -> int:
    from ..api import Session, load_tokenizer
    from ..report.run import report_text, run_report

    start = time.perf_counter()
    with open_engine(config, show_plan=not args.quiet) as engine:
        tokenizer = load_tokenizer(config.tokenizer or config.model) if kind == "text" else None
        if kind == "text" and not args.chat and not args.quiet and chats(tokenizer):
            print(chat_hint(args, prompt), file=sys.stderr, flush=True)  # before the raw completion streams
        ids, stop_ids, channel = _text_prompt(args, tokenizer, prompt) if kind == "text" else (prompt, (), None)
        engine.check_ids(ids)
        check_stop_ids(params.stop_ids, engine.config.vocab_size)
        trace, logits = TraceRecorder() if args.dump_trace else None, LogitsRecorder()
        disks = DiskWatch([config.model, config.trunk])
        # a routing trace covers every position: no prompt cache then
        cache = None if args.dump_trace or args.full_recompute else prompt_cache_from_args(args, engine, tokenizer)
        session = Session(engine, tokenizer, cache)
        grammar = session.schema_grammar(params, channel, f"--json-schema {args.json_schema}")
        load_seconds = time.perf_counter() - start
        events = session.generate(ids, params, stop_ids=stop_ids, channel=channel, full_recompute=args.full_recompute,
                                  observers=[logits, disks] + ([trace] if trace else []), speculation=speculate,
                                  grammar=grammar)
        done = print_events(events, kind)
        generated = done.ids
        report = run_report(engine, ids, generated, done.stats, load_seconds,
                            "full-recompute" if args.full_recompute else "incremental", cache)
        report.update(disks.report(), threads=args.threads, stop_reason=done.reason, seed=done.stats["seed"],
                      speculate=args.speculate, draft=draft_name(args) if args.speculate else None)
        if trace is not None:
            trace.write(args.dump_trace, engine)
    if args.disk_floor:
        report.update(disk_floor(config.model, report, args.disk_floor))
    if not args.quiet:
        print(report_text(report), file=sys.stderr)
    if args.dump_logits:
        import numpy as np
        outputs["--dump-logits"].write(np.stack(logits.rows).astype("<f4").tobytes())
    if args.json:
        outputs["--json"].write((json.dumps(report, indent=1) + "\n").encode())
    return 0


def add_parser(sub) -> None:
    fmt = argparse.RawDescriptionHelpFormatter
    run = sub.add_parser(
        "run", formatter_class=fmt, help="generate from one prompt (text or token ids), streamed",
        description="Load MODEL_DIR, consume the prompt and generate. Text prompts stream text (raw\n"
                    "completion, or one chat turn with --chat); id prompts print ids. Greedy unless\n"
                    "--temperature > 0. The memory plan is printed before loading; a run report after (--quiet:\n"
                    "neither).",
        epilog="examples:\n"
               "  k3 run 'What is the capital of France?' --chat     # the saved profile's model (k3 setup)\n"
               "  echo 'What is 7 + 5?' | k3 run --chat             # the prompt from standard input\n"
               "  k3 run demo-model --prompt 'The capital of France is' --max-tokens 20\n"
               "  k3 run demo-model --prompt 'Hello' --chat --thinking --temperature 1.0 --seed 7\n"
               "  k3 run demo-model --ids 1,2,3 --gen 8 --json run.json\n"
               "  k3 run demo-model --ids 5,6 --gen 4 --full-recompute   # recompute the whole sequence each step\n"
               "  k3 run demo-model 'Repeat after me: one two three' --chat --speculate auto   # ngram drafts\n"
               "  k3 run demo-model 'The capital of France, as JSON' --chat --json-schema city.schema.json --gen 100\n"
               "  k3 run demo-model --ids 1,2 --kernels scalar --threads 1 --dump-logits a.f32\n"
               "  k3 run demo-model --ids 1,2 --threads 2 --dump-logits b.f32 && cmp a.f32 b.f32\n"
               "  k3 run /models/Kimi-K3 --trunk /nvme/k3-trunk --preset laptop --prompt-file question.txt\n\n"
               + EXIT_CODES)
    add_engine_arguments(run)
    run.add_argument("text", metavar="PROMPT", nargs="?",
                     help="the prompt text (- reads standard input); with a saved profile MODEL_DIR may be left out: "
                          "k3 run 'What is the capital of France?' --chat")
    g = run.add_argument_group("prompt (exactly one; a pipe on standard input is read when none is given)")
    g.add_argument("--prompt", metavar="TEXT", help="text to continue (no BOS is added)")
    g.add_argument("--prompt-file", metavar="PATH", help="read the prompt text from a file")
    g.add_argument("--ids", help="prompt token ids, e.g. 1,2,3")
    g.add_argument("--ids-file", metavar="PATH", help="read prompt ids from a file (comma/space separated)")
    g.add_argument("--tok", metavar="DIR", help="tokenizer directory (default: MODEL_DIR)")
    g.add_argument("--chat", action="store_true", help="wrap the text as one user turn in the K3 chat format")
    g.add_argument("--thinking", action="store_true", help="with --chat: thinking mode (thinking goes to stderr)")
    g.add_argument("--system", metavar="TEXT", help="with --chat: a system message")
    g.add_argument("--json-schema", metavar="FILE",
                   help="the reply is JSON satisfying the JSON Schema in FILE, enforced token by token (with "
                        "--thinking, after free thinking); a reply cut off by --max-tokens ends mid-JSON and the "
                        "report's stop_reason says 'max tokens' (docs/STRUCTURED-OUTPUT.md)")
    add_sampling_arguments(run, default_max=16)
    add_speculation_arguments(run)
    add_prompt_cache_arguments(run)
    g = run.add_argument_group("output")
    g.add_argument("--full-recompute", action="store_true",
                   help="recompute the full sequence for every id instead of carrying decode state")
    g.add_argument("--json", metavar="OUT",
                   help="also write the report as JSON to OUT, only on success: a file is replaced atomically, a "
                        "device or FIFO is written through (--json /dev/stdout)")
    g.add_argument("--dump-logits", metavar="PATH",
                   help="write the float32 logits of every generated step to PATH (raw little-endian, one step "
                        "after another), to compare configurations byte for byte; written as --json is")
    g.add_argument("--dump-trace", metavar="DIR",
                   help="record (layer, expert) of every routing decision into DIR/expert_trace.bin + trace.json "
                        "(replay with `k3 sim-cache DIR`)")
    g.add_argument("--disk-floor", type=SECONDS, metavar="S", nargs="?", const=2.0,
                   help="after the run, probe the disk's O_DIRECT rate for S seconds (default 2) and report the disk "
                        "floor: bytes read per generated id ÷ that rate, and s/token as a multiple of it")
    g.add_argument("--quiet", action="store_true",
                   help="no memory plan, run report, tuning line nor hint to add --chat: the reply, what the model is "
                        "(the demo model: not Kimi K3) and errors only")
    run.set_defaults(func=cmd_run)
