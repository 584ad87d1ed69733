"""`k3 bench project`: full Kimi K3 at 8, 32, 64 and 128 GB of RAM, projected from rates measured on this machine
(k3core/machine/cost.py: the method), beside the C engine's published s/token — serially with a raw and with a
lossless trunk, and with a draft source's tokens per pass on transcripts (`--drafts-json`, the JSON of
`k3 bench drafts --transcripts … --json`); then the prompt side (plan/prefill.py), and with the transcripts an
agent's turn: its new prompt ids prefilled after its context, then its reply at the draft source's s/token.

Not a measurement of the real model: a projection, and it says so.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ...errors import UsageError
from ...files.limits import SMALL_FILE_BYTES, read_json_limited
from ...units import human
from ...machine.cost import (C_ENGINE_ACCEPTANCE, DRAFT_TOPK, K3_DRAFT_BYTES, K3_UNION, Drafts, Machine, layout_for,
                            ram_row, self_row)
from ...plan import prefill

RAM_GB = (8, 32, 64, 128)
# kimi-k3-in-c v1.0.0, README's "resident RAM / decode" table: one 124-core x86-64 with a 4.6 GB/s NVMe, RAM
# capped by a cgroup (its docs/data/speed-2026-08.md; the 128 GB row is "128+ GB", trunk resident, 179 GB peak RSS)
C_ENGINE_SECONDS = {8: 26.5, 32: 24.2, 64: 19.8, 128: 5.6}
# `k3 bench stream` on this machine (2-vCPU AMD EPYC, AVX-512; docs/performance-notes/projection-8gb.md): the
# planes trunk restored per core, and a whole token's kernels per core
MEASURED_DECODE_PER_CORE = 3.63e9
MEASURED_COMPUTE_PER_CORE = 8.2e9
DRAFT_KS = ("1", "2", "4", "8")  # `auto` varies its K pass by pass: its passes have no one union
AGENTIC_KINDS = ("rewrite", "search_replace", "tool_loop", "quote")  # benchmarks/transcripts' kinds
PLAIN_KINDS = ("plain",)
PROMPTS = (2_000, 30_000, 47_000)  # ids: a chat's first prompt, and Claude Code's first prompts (30-47k)
TURN_IDS = 1_000                   # "cached": all of the prompt but its last turn's ids are in the prompt cache
EXPERT_CACHE_BYTES = 1e9            # the laptop preset's expert cache, at every RAM size (RAM_BESIDES_TRUNK)
TURN_FIELDS = ("turns", "prompt_ids", "context_ids", "reply_ids")  # a drafts JSON's census of a kind's turns


def kind_groups(doc: dict) -> dict[str, list[str]]:
    """{group: its kinds} of a `k3 bench drafts --transcripts --json` document: the agentic kinds together and
    plain, where the file has them, else all its kinds as one group."""
    kinds = doc.get("kinds", {})
    groups = {name: [kind for kind in members if kind in kinds]
              for name, members in (("agentic", AGENTIC_KINDS), ("plain", PLAIN_KINDS))}
    return {name: members for name, members in groups.items() if members} or {"all kinds": list(kinds)}


def draft_groups(doc: dict, source: str | None) -> tuple[str, dict[str, list[Drafts]]]:
    """(source, {group: Drafts at K = 1, 2, 4, 8}) from a `k3 bench drafts --transcripts --json` document."""
    sources = doc.get("sources") or {}
    if source is None:
        source = next(iter(sources)) if len(sources) == 1 else "suffix"
    if source not in sources:
        raise UsageError(f"the drafts JSON has no source {source!r}; it has {', '.join(sources) or 'none'}")
    counts = sources[source]["counts"]

    def drafts(k: str, kinds) -> Drafts:
        rows = [counts[k]["by_kind"][kind] for kind in kinds]
        ids, passes, proposed = (sum(r[f] for r in rows) for f in ("ids", "passes", "proposed"))
        return Drafts(int(k), ids / passes, 1 + proposed / passes)

    return source, {name: [drafts(k, kinds) for k in DRAFT_KS] for name, kinds in kind_groups(doc).items()}


def turn_mix(doc: dict) -> dict[str, dict]:
    """{group: its kinds, their turns, new prompt ids, context ids and reply ids, and a mean turn's} from a
    `k3 bench drafts --transcripts --json` document: the prompt ids rounded to whole ids, the reply ids not (they
    only multiply an s/token)."""
    out = {}
    for name, kinds in kind_groups(doc).items():
        for kind in kinds:
            missing = [f for f in TURN_FIELDS if f not in doc["kinds"][kind]]
            if missing:
                raise UsageError(f"kinds.{kind} has no {' or '.join(missing)}: it was written before `k3 bench drafts` "
                                 "counted a turn's prompt ids; write it again (`make bench-drafts-bpe`, or "
                                 "`k3 bench drafts --transcripts … --json`)")
        total = {f: sum(doc["kinds"][kind][f] for kind in kinds) for f in TURN_FIELDS}
        out[name] = {"kinds": kinds, **total, "new_prompt_ids_per_turn": round(total["prompt_ids"] / total["turns"]),
                     "context_ids_per_turn": round(total["context_ids"] / total["turns"]),
                     "reply_ids_per_turn": total["reply_ids"] / total["turns"]}
    return out


def drafts_file(path) -> dict:
    """The JSON document of the file `path`; one that is not JSON is a UsageError naming it."""
    try:
        return read_json_limited(Path(path), SMALL_FILE_BYTES, "a drafts JSON")
    except (OSError, ValueError) as exc:
        raise UsageError(f"--drafts-json {path}: not readable JSON ({exc})") from None


def from_drafts(path, read, *args):
    """read(the document of `path`, *args); a document it cannot read is a UsageError naming the file."""
    doc = drafts_file(path)
    try:
        return read(doc, *args)
    except UsageError as exc:
        raise UsageError(f"--drafts-json {path}: {exc}") from None
    except (AttributeError, KeyError, TypeError, ZeroDivisionError) as exc:
        raise UsageError(f"--drafts-json {path}: not the JSON of `k3 bench drafts --transcripts … --json` "
                         f"({type(exc).__name__}: {exc})") from None


def read_drafts(path, source: str | None) -> tuple[str, dict[str, list[Drafts]]]:
    """draft_groups of the JSON file `path`; a file that is not one is a UsageError naming it."""
    return from_drafts(path, draft_groups, source)


def read_agent_drafts(path, source: str | None) -> tuple[str, dict[str, list[Drafts]], dict[str, dict]]:
    """read_drafts and the turn_mix of the JSON file `path`."""
    return from_drafts(path, lambda doc: (*draft_groups(doc, source), turn_mix(doc)))


def cmd_project(args) -> int:
    from ...machine.routing import last_forward, union_ratios

    if min(args.disk, args.cores, args.decode_per_core, args.compute_per_core) <= 0 or args.overhead < 1:
        raise UsageError("--disk, --cores, --decode-per-core and --compute-per-core must be positive, --overhead >= 1")
    machine = Machine(args.disk * 1e9, args.cores, args.decode_per_core * 1e9, args.compute_per_core * 1e9,
                      args.overhead)
    unions = tuple(union_ratios(last_forward(args.trace))) if args.trace else K3_UNION
    rows = int(DRAFT_KS[-1]) + 1
    if len(unions) < rows:
        raise UsageError(f"--trace {args.trace}: its last forward has {len(unions)} positions; a pass of "
                         f"K = {DRAFT_KS[-1]} drafts has {rows} rows")
    source, drafts, mix = (read_agent_drafts(args.drafts_json, args.draft_source) if args.drafts_json
                           else (None, {}, {}))
    macs_per_core = args.prefill_macs_per_core * 1e9
    rates = prefill.Rates(machine.disk, machine.cores, macs_per_core,
                          (args.attention_macs_per_core or 0.0) * 1e9)
    doc = {"machine": vars(machine), "unions": list(unions), "union_source": args.trace or "built in (k3-in-c trace)",
           "drafts_json": args.drafts_json, "draft_source": source,
           "drafts": {g: [vars(d) for d in ds] for g, ds in drafts.items()},
           "rows": [{**ram_row(gb * 1e9, machine, drafts, unions), "c_engine_seconds": C_ENGINE_SECONDS[gb]}
                    for gb in RAM_GB],
           "prefill_macs_per_core": macs_per_core, "attention_macs_per_core": rates.attention_rate,
           "turn_ids": TURN_IDS, "prompt": [prompt_row(gb * 1e9, rates) for gb in RAM_GB], "turn_mix": mix}
    doc["agent"] = [agent_row(r, p, rates, mix) for r, p in zip(doc["rows"], doc["prompt"]) if mix]
    doc["self"] = [{"ram": gb * 1e9, "kind": kind, "acceptance": name, "p": p,
                    "serial_seconds": min(row["raw"]["seconds_per_token"], row["lossless"]["seconds_per_token"]),
                    "best": self_row(gb * 1e9, machine, kind, p, unions)}
                   for gb, row in zip(RAM_GB, doc["rows"]) for kind in K3_DRAFT_BYTES
                   for name, p in C_ENGINE_ACCEPTANCE.items()]
    if args.chart:
        from .chart import write_chart

        print(f"k3 bench project: chart written to {write_chart(doc, args.chart)}", file=sys.stderr)
    print(json.dumps(doc, indent=1) if args.json else project_table(doc))
    return 0


def prefill_where(ram: float) -> prefill.Where:
    """What a prefill pass at `ram` bytes reads: a raw trunk laid out as the serial column's, the expert cache of
    EXPERT_CACHE_BYTES."""
    layout = layout_for(ram, 1.0)
    return prefill.Where(layout.streamed * layout.ratio, 1.0, EXPERT_CACHE_BYTES // prefill.K3.expert_bytes)


def prompt_row(ram: float, rates: prefill.Rates) -> dict:
    """The prompt side at `ram` bytes (plan/prefill.py): the chunk `auto` picks (prefill_where), its seconds per
    prompt id beside 512's, and the time to the first token of each of PROMPTS, cold and with all but its last
    TURN_IDS ids in the prompt cache."""
    where = prefill_where(ram)
    choice = prefill.choose_chunk(prefill.K3, where, rates, prefill.most_rows(prefill.K3, ram))
    ttft = {str(n): {"cold": prefill.prompt_seconds(prefill.K3, where, rates, choice.chunk, n),
                     "cached": prefill.prompt_seconds(prefill.K3, where, rates, choice.chunk, n, n - TURN_IDS)}
            for n in PROMPTS}
    return {"ram": ram, "layout": layout_for(ram, 1.0).name, "chunk": choice.chunk, "most": choice.most,
            "seconds_per_id": choice.seconds_per_id, "seconds_per_id_at_512": choice.default_seconds_per_id,
            "ttft": ttft}


def agent_row(row: dict, prompt: dict, rates: prefill.Rates, mix: dict[str, dict]) -> dict:
    """A mean turn of each group of `mix` (turn_mix) at the RAM of `row` (ram_row) and `prompt` (prompt_row): its
    new prompt ids prefilled after its context ids in the chunk `auto` picks, then its reply ids at the group's
    speculative s/token; the seconds of each, of the turn, and of the turn per reply id."""
    where = prefill_where(row["ram"])
    groups = {}
    for group, m in mix.items():
        context = m["context_ids_per_turn"]
        prefill_seconds = prefill.prompt_seconds(prefill.K3, where, rates, prompt["chunk"],
                                                 context + m["new_prompt_ids_per_turn"], context)
        reply_seconds = m["reply_ids_per_turn"] * row["speculation"][group]["seconds_per_token"]
        turn = prefill_seconds + reply_seconds
        groups[group] = {"prefill_seconds": prefill_seconds, "reply_seconds": reply_seconds,
                         "seconds_per_turn": turn, "seconds_per_reply_id": turn / m["reply_ids_per_turn"]}
    return {"ram": row["ram"], "chunk": prompt["chunk"], "groups": groups}


def _duration(seconds: float) -> str:
    return (f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min" if seconds < 7200
            else f"{seconds / 3600:.1f} h")


def prompt_table(doc: dict) -> list[str]:
    """The prompt side of `doc` as Markdown: the chunk, seconds per prompt id, time to the first token."""
    lines = ["", f"time to the first token, **projected** (k3core/plan/prefill.py; prefill at "
                 f"{doc['prefill_macs_per_core'] / 1e9:.0f} G multiply-adds/s per core, MLA attention at "
                 f"{doc['attention_macs_per_core'] / 1e9:.1f}; cached: all but the last "
                 f"{doc['turn_ids']:,} ids of the prompt in the prompt cache):", "",
             "| RAM | prefill chunk (auto) | s / prompt id | at 512 |"
             + "".join(f" {n // 1000}k ids, cold | {n // 1000}k, cached |" for n in PROMPTS),
             "|---:|---:|---:|---:|" + "---:|---:|" * len(PROMPTS)]
    for r in doc["prompt"]:
        lines.append(f"| {r['ram'] / 1e9:.0f} GB | {r['chunk']} | {r['seconds_per_id']:.3f} | "
                     f"{r['seconds_per_id_at_512']:.3f} |"
                     + "".join(f" {_duration(r['ttft'][str(n)]['cold'])} *projected* | "
                               f"{_duration(r['ttft'][str(n)]['cached'])} *projected* |" for n in PROMPTS))
    return lines


def project_table(doc: dict) -> str:
    """The document of `k3 bench project` as Markdown: the seed-shaped table, then how each figure came about."""
    m, source = doc["machine"], doc["draft_source"]
    groups = list(doc["drafts"])
    lines = [f"full Kimi K3, **projected** (k3core/machine/cost.py): disk {m['disk'] / 1e9:.2f} GB/s, {m['cores']} cores "
             f"restoring {m['decode_per_core'] / 1e9:.2f} GB/s and computing {m['compute_per_core'] / 1e9:.2f} GB/s "
             f"each, overhead {m['overhead']:.2f}; expert unions {doc['union_source']}"
             + (f"; tokens per pass of `{source}` from {doc['drafts_json']}" if source else
                "; no --drafts-json, so no speculative columns"), "",
             "| RAM | C engine, published s/token | k3 serial, raw trunk | k3 serial, lossless trunk |"
             + "".join(f" k3 + {source}, {g} |" for g in groups),
             "|---:|---:|---:|---:|" + "---:|" * len(groups)]
    for r in doc["rows"]:
        cells = [r["raw"], r["lossless"], *(r["speculation"][g] for g in groups)]
        lines.append(f"| {r['ram'] / 1e9:.0f} GB | {r['c_engine_seconds']} |"
                     + "".join(f" {c['seconds_per_token']:.1f} *projected* |" for c in cells))
    lines += ["", "| RAM | column | trunk | K | tokens / pass | rows / pass | expert union | read / token | "
                  "disk s / pass | CPU s / pass | s/token |", "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["rows"]:
        for name, c in [("serial, raw", r["raw"]), ("serial, lossless", r["lossless"]),
                        *((f"{source}, {g}", r["speculation"][g]) for g in groups)]:
            lines.append(f"| {r['ram'] / 1e9:.0f} GB | {name} | {c['layout']} | {c['k'] or '–'} | "
                         f"{c['tokens_per_pass']:.2f} | {c['rows']:.2f} | {c['union']:.2f}× | "
                         f"{human(c['bytes_per_token'])} | {c['disk_seconds']:.1f} | {c['cpu_seconds']:.1f} | "
                         f"{c['seconds_per_token']:.2f} |")
    return "\n".join(lines + self_table(doc) + prompt_table(doc) + agent_table(doc))


def self_table(doc: dict) -> list[str]:
    """`self` drafts by RAM, draft kind and the C engine's acceptance figures, beside the best serial s/token."""
    lines = ["", "`self` drafts, **projected** (k3core/machine/cost.py self_row): the draft trunk held in RAM, the "
                 f"model in what is left; the draft routes {DRAFT_TOPK} of 16 experts a token, read from disk as the "
                 "model's are; acceptance per drafted id from the C engine's real-model figures (live: 66.7 % of "
                 "drafts accepted; teacher-forced: 94.2 % agreement — an upper bound). The same for plain chat and "
                 "agent work: `--draft auto` takes, each pass, suffix where it matches (the columns above) or self.",
             "",
             "| RAM | draft | acceptance | model's layout | K | tokens / pass | draft s / pass | verify s / pass | "
             "read / token | s/token | ÷ serial |", "|---:|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["self"]:
        b = r["best"]
        draft = f"{r['kind']} ({K3_DRAFT_BYTES[r['kind']] / 1e9:.1f} GB)"
        head = f"| {r['ram'] / 1e9:.0f} GB | {draft} | {r['acceptance']} |"
        if b is None:
            lines.append(head + " does not fit beside the model's 8 GB | | | | | | | |")
            continue
        lines.append(head + f" {b['layout']} | {b['k']} | {b['tokens_per_pass']:.2f} | {b['draft_seconds']:.1f} | "
                     f"{b['verify_seconds']:.1f} | {human(b['bytes_per_token'])} | {b['seconds_per_token']:.1f} "
                     f"*projected* | {b['seconds_per_token'] / r['serial_seconds']:.2f} |")
    return lines


def agent_table(doc: dict) -> list[str]:
    """An agent's mean turn as Markdown: its ids from the transcripts, its seconds at each RAM size."""
    if not doc["agent"]:
        return ["", "no --drafts-json, so no agent turns (their prompt and reply ids are the transcripts')"]
    mix, source = doc["turn_mix"], doc["draft_source"]
    lines = ["", f"an agent's turn, **projected**: the mean turn of each group of kinds in {doc['drafts_json']} (the "
                 "transcripts' own mix), its new prompt ids (those its conversation did not already hold: no prompt "
                 f"cache can give them) prefilled after its context in the chunk above, then its reply ids at "
                 f"`{source}`'s s/token:", "",
             "| RAM | kinds | turns | new prompt ids / turn | after context ids | reply ids / turn | prefill / turn | "
             "reply / turn | s / turn | s / reply id, prompt charged | s / reply id, reply alone |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for a, r in zip(doc["agent"], doc["rows"]):
        for group, c in a["groups"].items():
            m = mix[group]
            seconds = [_duration(c[f]) for f in ("prefill_seconds", "reply_seconds", "seconds_per_turn")]
            seconds += [f"{c['seconds_per_reply_id']:.1f}", f"{r['speculation'][group]['seconds_per_token']:.1f}"]
            lines.append(f"| {a['ram'] / 1e9:.0f} GB | {group} | {m['turns']} | {m['new_prompt_ids_per_turn']:,} | "
                         f"{m['context_ids_per_turn']:,} | {m['reply_ids_per_turn']:,.0f} |"
                         + "".join(f" {cell} *projected* |" for cell in seconds))
    return lines


def add_parser(sub) -> None:
    from ..options import number

    import argparse

    p = sub.add_parser(
        "project", help="full K3 at 8/32/64/128 GB of RAM, projected from this machine's rates, beside the C engine",
        formatter_class=argparse.RawDescriptionHelpFormatter, description=__doc__.split("\n\n")[0],
        epilog="examples:\n  k3 bench project\n"
               "  k3 bench drafts --transcripts benchmarks/transcripts/transcripts.jsonl --sources suffix --json "
               "> drafts.json\n  k3 bench project --drafts-json drafts.json\n"
               "  k3 bench project --drafts-json drafts.json --disk 4.6 --cores 124   # the C engine's machine\n"
               "  k3 bench project --drafts-json drafts.json --chart docs/projection.svg   # the tables as a picture")
    p.add_argument("--drafts-json", metavar="FILE", help="`k3 bench drafts --transcripts … --json` output: "
                   "speculative columns from its tokens per pass at K = 1, 2, 4, 8, and an agent's turn from its "
                   "prompt and reply ids")
    p.add_argument("--draft-source", metavar="NAME", help="the draft source of FILE to use (default: its only one, "
                   "else suffix)")
    p.add_argument("--disk", type=number("GB/s", above=True), default=7.0, metavar="GB/s", help="disk read rate (default 7)")
    p.add_argument("--cores", type=int, default=16, metavar="N", help="cores (default 16)")
    p.add_argument("--decode-per-core", type=number("GB/s", above=True), default=MEASURED_DECODE_PER_CORE / 1e9, metavar="GB/s",
                   help="lossless trunk restored per core (default: this machine's, "
                        f"{MEASURED_DECODE_PER_CORE / 1e9:g}, docs/PERFORMANCE.md)")
    p.add_argument("--compute-per-core", type=number("GB/s", above=True), default=MEASURED_COMPUTE_PER_CORE / 1e9, metavar="GB/s",
                   help="a token's weight bytes through the kernels per core (default: this machine's, "
                        f"{MEASURED_COMPUTE_PER_CORE / 1e9:g}, docs/PERFORMANCE.md)")
    p.add_argument("--overhead", type=number("a ratio", above=True), default=1.0, help="a streamed run's s/token ÷ its disk floor (default 1: "
                   "this machine's floor runs were under theirs)")
    p.add_argument("--prefill-macs-per-core", type=number("G/s", above=True), default=prefill.ASSUMED_MACS_PER_CORE / 1e9,
                   metavar="G/s", help="multiply-adds per second per core a prefill pass reaches end to end (default "
                   f"{prefill.ASSUMED_MACS_PER_CORE / 1e9:g}: `wide`'s prefill on a Zen 4 core, issue 39)")
    p.add_argument("--attention-macs-per-core", type=number("G/s", above=True), metavar="G/s",
                   help="multiply-adds per second per core of MLA attention over a long context (`k3 bench kernels`' "
                   f"MLA attention row; default {prefill.ATTENTION_RATIO:g} x --prefill-macs-per-core, the ratio "
                   "measured on an Ice Lake core)")
    p.add_argument("--trace", metavar="FILE", help="expert unions from this routing trace's last forward (default: "
                   "the k3-in-c trace's, built in)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--chart", metavar="FILE.svg|FILE.png", help="also draw s/token and the time to the first token "
                   "by RAM into FILE (matplotlib: the charts extra, pip install 'k3[charts]')")
    p.set_defaults(func=cmd_project)
