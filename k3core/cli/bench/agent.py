"""`k3 bench agent`: conversations replayed as a coding agent makes them, with and without the prompt cache.

The workload: one long system prompt and --tools tool declarations (generated text and schemas of the sizes
asked), and two conversations on them (two tasks), each a tool loop: the agent sends the whole history, the model
replies (greedy, up to --tokens ids), the agent appends the reply and a tool result (--tool-ids ids of generated
text) and sends it again, --turns times. The second conversation starts a turn after the first (as a subagent
does); from then on both conversations' requests are advanced together in one BatchGenerator, as `k3 serve`
advances concurrent requests.

Modes, in one process on one engine (so the ratios are free of process-to-process noise):
  off           every request forwards its whole prompt
  conversation  a conversation resumes from its own last state when its prompt extends it (k3 before the prompt
                cache: a second conversation, or a history that re-renders otherwise, starts over)
  prefix        the prompt cache in RAM, shared by both conversations
  disk          the prompt cache with no RAM (every checkpoint read back from disk), then a restart: a new cache
                over the same directory serves a third conversation's first request
Reported per mode: prompt ids sent, forwarded and reused, time to first token (mean, max), decode s/token, wall;
and whether every mode generated the same ids (it must: the cache changes no bit).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from dataclasses import dataclass, field

from ...errors import UsageError

WORDS = ("the agent reads a file runs a command edits a line checks the result and reports what changed in the "
         "repository when a test fails it looks at the error finds the cause and tries again").split()
MODES = ("off", "conversation", "prefix", "disk")


def words(n_ids: int, tokenizer, seed: int) -> str:
    """Generated text of about `n_ids` ids of this tokenizer."""
    r, out, have = random.Random(seed), [], 0
    while have < n_ids:
        chunk = " ".join(r.choice(WORDS) for _ in range(64)) + ".\n"
        out.append(chunk)
        have += len(tokenizer.encode(chunk))
    return "".join(out)


def tools(n: int, tokenizer, seed: int) -> list[dict]:
    return [{"name": f"tool_{i}", "description": words(120, tokenizer, seed + i),
             "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "line": {"type": "integer"}},
                            "required": ["path"]}} for i in range(n)]


@dataclass
class Conversation:
    task: str
    messages: list = field(default_factory=list)
    state: object = None      # mode "conversation": this conversation's last state


def workload(tokenizer, system_ids: int, tasks: int, n_tools: int = 6):
    system = words(system_ids, tokenizer, 1)
    declared = tools(n_tools, tokenizer, 100)
    return system, declared, [Conversation(f"Task {i}: " + words(60, tokenizer, 1000 + i)) for i in range(tasks)]


def run_mode(engine, tokenizer, mode: str, args, cache_dir: str) -> dict:
    from ...generation.batch import BatchGenerator
    from ...text.chat import EOM, render, split_reply
    from ...generation.prefix_cache import PrefixCache
    from ...generation.sampling import Sampler, SamplingParams

    system, declared, convs = workload(tokenizer, args.system_ids, 2, args.tools)
    eom = tokenizer.id_of(EOM)
    cache = None
    if mode == "prefix":
        cache = PrefixCache(engine, 1 << 40, args.interval, [eom])
    elif mode == "disk":
        cache = PrefixCache(engine, 0, args.interval, [eom], cache_dir, 1 << 40)
    rows, generated = [], []

    def serve(batch_convs):
        """One request of each conversation, advanced together; their rows."""
        batch, jobs = BatchGenerator(engine), {}
        started = time.perf_counter()
        for conv in batch_convs:
            prompt = render([{"role": "system", "content": system}, *conv.messages], tokenizer, "instruct",
                            tools=declared)
            if cache is not None:
                state = cache.resume(prompt)
            elif mode == "conversation" and conv.state is not None and len(prompt) > len(conv.state.ids) \
                    and prompt[:len(conv.state.ids)] == conv.state.ids:
                state = conv.state
            else:
                state = engine.new_state()
            reused = len(state.ids)
            handle = batch.add(prompt, state, Sampler(SamplingParams(max_tokens=args.tokens)),
                               checkpoints=cache.positions(prompt, reused) if cache else (),
                               on_checkpoint=cache.keep if cache else None)
            jobs[handle] = {"conv": conv, "prompt": len(prompt), "reused": reused, "ids": [], "stamps": []}
        while batch.sequences:
            for e in batch.step():
                job = jobs[e.handle]
                job["ids"].append(e.token)
                job["stamps"].append(time.perf_counter())
                if e.token == eom or len(job["ids"]) >= args.tokens:
                    state = batch.remove(e.handle)
                    if cache is not None:
                        cache.keep(state)
                    job["conv"].state = state
        for job in jobs.values():
            stamps, conv = job["stamps"], job["conv"]
            rows.append({"prompt": job["prompt"], "reused": job["reused"], "ttft": stamps[0] - started,
                         "decode": (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else None})
            generated.append(job["ids"])
            text = split_reply(job["ids"], tokenizer, "instruct").content  # as a client reads the reply
            conv.messages += [{"role": "assistant", "content": text},
                              {"role": "tool", "name": "tool_0", "content": words(args.tool_ids, tokenizer,
                                                                                  len(rows))}]

    started = time.perf_counter()
    for conv in convs:
        conv.messages.append({"role": "user", "content": conv.task})
    for r in range(args.turns + 1):  # the second conversation starts a turn later (a subagent), then both at once
        serve(([convs[0]] if r < args.turns else []) + ([convs[1]] if r > 0 else []))
    wall = time.perf_counter() - started
    out = summary(mode, rows, wall)
    out["ids"] = list(generated)
    if mode == "disk":  # a restart: a new cache over the same directory, a new conversation's first request
        cache = PrefixCache(engine, 0, args.interval, [eom], cache_dir, 1 << 40)
        third = Conversation("Task 9: " + words(60, tokenizer, 1009), [])
        third.messages.append({"role": "user", "content": third.task})
        rows.clear()
        serve([third])
        out["after_restart"] = summary("after a restart", rows, rows[0]["ttft"])
    return out


def summary(mode: str, rows: list[dict], wall: float) -> dict:
    prompt, reused = sum(r["prompt"] for r in rows), sum(r["reused"] for r in rows)
    decode = [r["decode"] for r in rows if r["decode"]]
    return {"mode": mode, "requests": len(rows), "prompt_ids": prompt, "reused_ids": reused,
            "forwarded_ids": prompt - reused, "ttft_mean": sum(r["ttft"] for r in rows) / len(rows),
            "ttft_max": max(r["ttft"] for r in rows), "seconds_per_token": sum(decode) / len(decode) if decode else None,
            "wall": wall}


def table(result: dict) -> str:
    lines = [f"k3 bench agent: {result['model']}; system prompt {result['system_ids']} ids + {result['tools']} tools, 2 conversations "
             f"(the second a turn later), {result['turns']} turns each, replies up to {result['tokens']} ids, tool results "
             f"{result['tool_ids']} ids",
             f"{'mode':<16}{'requests':>9}{'prompt ids':>12}{'forwarded':>11}{'reused':>9}{'TTFT mean':>11}"
             f"{'TTFT max':>10}{'s/token':>9}{'wall s':>9}{'vs off':>8}"]
    off = next((m["wall"] for m in result["modes"] if m["mode"] == "off"), None)
    for m in [*result["modes"], *[m["after_restart"] for m in result["modes"] if "after_restart" in m]]:
        spt = f"{m['seconds_per_token']:.3f}" if m["seconds_per_token"] else "–"
        vs = f"{off / m['wall']:.2f}x" if off and m["mode"] != "after a restart" else ""
        lines.append(f"{m['mode']:<16}{m['requests']:>9}{m['prompt_ids']:>12}{m['forwarded_ids']:>11}"
                     f"{m['reused_ids']:>9}{m['ttft_mean']:>10.2f}s{m['ttft_max']:>9.2f}s{spt:>9}{m['wall']:>9.1f}"
                     f"{vs:>8}")
    lines.append(f"same ids in every mode: {'yes' if result['same_ids'] else 'NO'}")
    return "\n".join(lines)


def cmd_agent(args) -> int:
    from ...api import EngineConfig, load_tokenizer, open_engine

    modes = args.modes.split(",")
    if bad := [m for m in modes if m not in MODES]:
        raise UsageError(f"--modes: {', '.join(bad)} is not a mode; the modes are {', '.join(MODES)}")
    for flag, value in (("--system-ids", args.system_ids), ("--turns", args.turns), ("--tokens", args.tokens),
                        ("--interval", args.interval)):
        if value < 1:
            raise UsageError(f"{flag} must be at least 1, got {value}")
    config = EngineConfig(args.model, sequences=2, max_context=args.max_context, prefill_chunk=args.prefill_chunk)
    tokenizer = load_tokenizer(args.model)
    results = []
    with open_engine(config) as engine, tempfile.TemporaryDirectory() as cache_dir:
        for mode in modes:
            print(f"k3 bench agent: {mode} …", file=sys.stderr, flush=True)
            results.append(run_mode(engine, tokenizer, mode, args, cache_dir))
    same = all(r["ids"] == results[0]["ids"] for r in results)
    result = {"model": str(args.model), "system_ids": args.system_ids, "tools": args.tools, "turns": args.turns,
              "tokens": args.tokens,
              "tool_ids": args.tool_ids, "same_ids": same,
              "modes": [{k: v for k, v in r.items() if k != "ids"} for r in results]}
    print(json.dumps(result, indent=1) if args.json else table(result))
    return 0 if same else 1


def add_parser(sub) -> None:
    p = sub.add_parser("agent", help="an agent's conversations with and without the prompt cache: time to first "
                                     "token, prompt ids forwarded vs reused",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog="examples:\n  k3 bench agent wizard/data/demo-model\n"
                              "  k3 bench agent wizard/data/demo-model --system-ids 30000 --turns 4\n"
                              "  k3 make-model /tmp/wide --shape wide && k3 bench agent /tmp/wide --system-ids 256 "
                              "--tools 2 --turns 1 --tokens 4 --modes off,prefix,disk")
    p.add_argument("model", metavar="MODEL_DIR")
    p.add_argument("--system-ids", type=int, default=8000, metavar="N", help="system prompt size (default 8000)")
    p.add_argument("--tools", type=int, default=6, metavar="N", help="tools declared, ~120 ids each (default 6)")
    p.add_argument("--tool-ids", type=int, default=200, metavar="N", help="each tool result's size (default 200)")
    p.add_argument("--turns", type=int, default=3, metavar="N", help="requests per conversation (default 3)")
    p.add_argument("--tokens", type=int, default=16, metavar="N", help="reply length at most (default 16)")
    p.add_argument("--interval", type=int, default=4096, metavar="N", help="the prompt cache's checkpoint interval")
    p.add_argument("--max-context", type=int, default=65536, metavar="N", help="positions (default 65536)")
    p.add_argument("--prefill-chunk", type=int, default=512, metavar="N", help="prompt ids per pass (default 512)")
    p.add_argument("--modes", default=",".join(MODES), metavar="A,B", help=f"default {','.join(MODES)}")
    p.add_argument("--json", action="store_true", help="print a JSON document instead of the table")
    p.set_defaults(func=cmd_agent)
