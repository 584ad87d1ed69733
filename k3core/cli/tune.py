"""`k3 tune [MODEL_DIR]`: measure the fastest exact settings for this machine, save them in the profile, and say
what was tried. The search is k3core/tune/; this is its command line: the workload, progress, the table, the
saved profile."""
from __future__ import annotations

import argparse
import json
import sys
import time

from ..errors import TokenizerError, UsageError
from ..units import human
from .options import add_engine_arguments, engine_config_from_args, number

QUESTIONS = ("What is the capital of France?", "Write a short Python function that reverses a string.",
             "Explain in two sentences why the sky is blue.")
MAX_PROMPTS, MAX_REPLY, MAX_MINUTES = 16, 256, 24 * 60
SEEDED_IDS = 32  # a prompt's ids where the model has no tokenizer


def workload(args, config):
    """The prompts (chat turns through the model's tokenizer; seeded ids where it has none) and the reply length."""
    import numpy as np

    from ..api import load_tokenizer
    from ..tune.run import Workload

    if not 2 <= args.reply <= MAX_REPLY:
        raise UsageError(f"--reply takes 2..{MAX_REPLY} ids (s/token needs a second one), got {args.reply}")
    texts = args.prompt or list(QUESTIONS)
    if len(texts) > MAX_PROMPTS:
        raise UsageError(f"--prompt: at most {MAX_PROMPTS} prompts, got {len(texts)}")
    try:
        tokenizer = load_tokenizer(config.tokenizer or config.model)
    except TokenizerError:
        if args.prompt:
            raise
        vocab = _vocab(config.model)
        rng = np.random.default_rng(0)
        return Workload(tuple(tuple(int(i) for i in rng.integers(0, vocab, SEEDED_IDS)) for _ in texts), args.reply)
    return Workload(tuple(tuple(_chat_turn(tokenizer, text)) for text in texts), args.reply)


def _chat_turn(tokenizer, text: str) -> list[int]:
    """A user turn in the model's chat format; the plain text's ids where its tokenizer has no chat tokens."""
    from ..api import Conversation

    chat = Conversation(tokenizer)
    chat.add_user(text)
    try:
        return chat.prompt()
    except TokenizerError:
        return tokenizer.encode(text)


def _vocab(model) -> int:
    from ..format.checkpoint import open_checkpoint

    ckpt = open_checkpoint(model)
    try:
        return ckpt.config.vocab_size
    finally:
        ckpt.close()


def cmd_tune(args) -> int:
    from ..tune.run import Interrupted, tune, tuned_result

    draft_trunk, args.draft_trunk = args.draft_trunk, None  # a trial asks for its own speculation
    base = engine_config_from_args(args, tuned=False)
    if draft_trunk:
        base = base.replace(draft_trunk=draft_trunk)
    work = workload(args, base)
    longest = sum(map(len, work.prompts)) + work.reply * len(work.prompts)  # the conversation of every prompt
    if longest > (base.max_context if base.max_context != "auto" else 4096):
        base = base.replace(max_context=longest)
    only = [k for k in (args.knobs or "").split(",") if k]
    started = time.monotonic()
    progress = Progress()
    try:
        outcome = tune(base, work, minutes=args.minutes, only=only, grid=args.grid, on_trial=progress.trial,
                       on_start=progress.start)
        interrupted = False
    except Interrupted as stop:
        outcome, interrupted = stop.outcome, True
    result = tuned_result(base, progress.shape, outcome, work, started)
    where = None if args.no_save or args.grid else save(result, base)
    knobs = [{"knob": k.name, "values": list(k.values), "what": k.what} for k in progress.knobs]
    doc = {"model": str(base.model), "tuned": result.as_dict(), "knobs": knobs, "not_turned": progress.left,
           "not_tried": outcome.not_tried, "saved": str(where) if where else None, "grid": args.grid}
    print(json.dumps(doc, indent=1) if args.json else table(outcome, result, progress, where, args.grid))
    return 130 if interrupted else 0


class Progress:
    """One line per trial on stderr as it lands (with --json too: the document goes to stdout)."""

    def __init__(self):
        self.count, self.shape, self.left, self.knobs = 0, None, [], []

    def say(self, text: str) -> None:
        print(text, file=sys.stderr, flush=True)

    def start(self, shape, knobs, left) -> None:
        self.shape, self.knobs, self.left = shape, knobs, left
        tries = 1 + sum(len(k.values) - 1 for k in knobs)
        self.say(f"k3 tune: {len(knobs)} knobs ({', '.join(k.name for k in knobs)}), up to {tries} trials, each in a "
                 "process of its own; Ctrl-C stops and keeps what was measured")

    def trial(self, trial, best, start) -> None:
        from ..tune.knobs import describe

        self.count += 1
        self.say(f"  [{self.count}] {describe(trial.setting, start) or 'untuned'}: {trial.skipped or _figures(trial)}"
                 + (f" (best so far {_figures(best)})" if best and not trial.skipped else ""))


def _figures(trial) -> str:
    """`0.3124 s/token, prompts 28.1 s` (what the search judges by: search.PHASES)."""
    spt, prompt, turns = trial.score("decode"), trial.score("prefill"), trial.score("turn")
    if turns:
        return f"conversation {turns:.3g} s ({trial.figures['seconds_per_token']:.4g} s/token)"
    return (f"{spt:.4g} s/token" if spt else f"{trial.seconds:.3g} s") + (f", prompts {prompt:.3g} s" if prompt else "")


def save(result, base):
    """Into the saved profile when it is this model's (a new profile when there is none); the path, or None."""
    from ..plan.profile import Profile, load_profile, profile_path, save_profile
    from ..plan.tuned import same_model

    profile = load_profile()
    if profile is not None and not same_model(profile.model, base.model):
        print(f"k3 tune: not saved: the saved profile ({profile_path()}) is for {profile.model}; `k3 setup` makes "
              "one for this model", file=sys.stderr)
        return None
    budget = base.budget()
    if profile is None:
        profile = Profile(model=str(base.model), trunk=str(base.trunk) if base.trunk else None)
    if (profile.preset, profile.trunk_gb, profile.cache_gb) != (base.preset, base.trunk_gb, base.cache_gb):
        profile.preset, profile.trunk_gb, profile.cache_gb = base.preset, base.trunk_gb, base.cache_gb
        print(f"k3 tune: the profile's budgets are now the tuned ones: trunk {budget.trunk_gb} GB, cache "
              f"{budget.cache_gb} GB", file=sys.stderr)
    profile.tuned = result.as_dict()
    return save_profile(profile)


def table(outcome, result, progress, where, grid: bool) -> str:
    from ..tune.knobs import describe, shown
    from ..tune.run import PROMPTS

    start = outcome.start
    w = result.measured["workload"]
    lines = [f"k3 tune: {result.model}, {w['prompts']} prompts ({sum(w['prompt_ids'])} ids) × {w['reply_ids']} reply "
             f"ids each, {result.machine['cpus']} CPUs, {result.measured.get('kernels')} kernels", "",
             "| knob | value | setting (what differs from untuned) | prompts | s/token | prompt s | turns s | "
             "peak RSS |",
             "|---|---|---|---|---:|---:|---:|---:|"]
    for t in outcome.trials + outcome.confirm:
        knob = t.knob or ("(again)" if t in outcome.confirm else "(grid)" if grid else "(untuned)")
        value = shown(t.setting[t.knob]) if t.knob else ""
        mark = " ←" if t.setting == outcome.best else ""
        head = f"| {knob} | {value} | {describe(t.setting, start) or 'untuned'}{mark} |"
        if t.seconds is None:
            lines.append(f"{head} | {t.skipped} | | | |")
            continue
        spt = t.figures.get("seconds_per_token") if t.phase == "turn" else t.score("decode")
        prompt, turns = t.score("prefill"), t.score("turn")
        lines.append(f"{head} {PROMPTS[t.phase]} | {f'{spt:.4g}' if spt else ''} | {f'{prompt:.3g}' if prompt else ''}"
                     f" | {f'{turns:.3g}' if turns else ''} | {human(t.figures.get('peak_rss_bytes') or 0)} |")
    gain, prompt, turns = outcome.gain("decode"), outcome.gain("prefill"), outcome.gain("turn")
    best = describe(outcome.best, start) or "the untuned settings"
    lines += ["", f"{'best of the grid' if grid else 'winner'}: {best}"
              + (f": {gain:.2f}× the untuned speed per token" if gain else "")
              + (f", the prompt in {1 / prompt:.2f}× its time" if prompt else "")
              + (f", a conversation in {1 / turns:.2f}× its time" if turns else "")
              + ("" if outcome.complete else " (incomplete: --minutes or Ctrl-C cut it short)")]
    lines += ["prompts: forwarded (the prompt's time measured), resumed from the states the first trial kept "
              "(only the reply measured), or conversation (the prompts as one conversation's turns, each sent whole "
              "with the turns before it; prompt and reply measured)"]
    lines += [f"turned: {k.name} ({', '.join(map(shown, k.values))}): {k.what}" for k in progress.knobs]
    lines += [f"not turned: {x}" for x in progress.left]
    lines += [f"not tried: {x}" for x in outcome.not_tried]
    if where:
        lines.append(f"saved in {where}: `k3 run`, `chat`, `serve` and `ui` use it for this model (a flag overrides "
                     "its field); `k3 doctor` shows it")
    return "\n".join(lines)


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "tune", formatter_class=argparse.RawDescriptionHelpFormatter,
        help="measure the fastest exact settings for this machine and save them in the profile",
        description="Measure which settings run this model fastest here — threads (per kernel family too), the\n"
                    "ring, the split of the budget between trunk, expert cache, prompt cache and draft trunk,\n"
                    "expert reads in flight and their size, prefetch and its depth, the prefill chunk, the draft\n"
                    "source, the draft model's experts and drafted ids per pass — by running a short chat\n"
                    "workload once per setting, each in a process of its own, and keep the fastest.\n"
                    "Coordinate descent from the untuned settings, one knob at a time; a value is kept only when\n"
                    "it is more than 3 % faster — per reply token; for the knobs that shape only the prompt's\n"
                    "pass (prefill chunk, read-ahead) in the prompt's time; for the prompt cache in the time of\n"
                    "the prompts as one conversation, each turn sent whole — and the winner is measured again\n"
                    "against the untuned settings.\n"
                    "Every trial must give the same ids as the first: one that does not stops the tune (exit 4),\n"
                    "naming the setting — that is a bug to report, never a setting to pick.\n\n"
                    "The winner is saved in the profile (when it is this model's, or there is none); `k3 run`,\n"
                    "`chat`, `serve` and `ui` then use it for every flag left out, and `k3 doctor` shows it.\n"
                    "Tuned on another machine (CPU, RAM or disk changed), it is not used and k3 says so.",
        epilog="examples:\n"
               "  k3 tune                                  # the saved profile's model, at its budget (a few minutes)\n"
               "  k3 tune /nvme/k3 --trunk /nvme/k3-trunk --trunk-gb 6 --cache-gb 2 --minutes 10\n"
               "  k3 tune --prompt \"$(cat agent-prompt.txt)\" --reply 32   # tune on your own kind of prompt\n"
               "  k3 tune --knobs threads,prefetch --grid --no-save       # every combination, to check the search\n"
               "  k3 tune --json > tune.json\n\n"
               "exit codes: 0 tuned; 2 bad usage; 4 a setting changed the ids (a bug: report it); 130 Ctrl-C\n"
               "(what was measured is saved)")
    add_engine_arguments(p)
    g = p.add_argument_group("the tune")
    g.add_argument("--minutes", type=number("minutes", above=True, high=MAX_MINUTES), default=5.0, metavar="M",
                   help="stop starting trials after M minutes (default 5); the table says what was not tried")
    g.add_argument("--prompt", action="append", metavar="TEXT",
                   help="a user message to time (repeatable, at most 16; default: three short questions). Drafts, "
                        "prefill chunks and caches behave as on the prompts you give")
    g.add_argument("--reply", type=int, default=16, metavar="N", help="ids generated for each prompt (default 16)")
    g.add_argument("--draft-trunk", metavar="DIR|int8|int4",
                   help="a draft trunk (`k3 pack --draft`): the self and auto draft sources are tried too")
    g.add_argument("--knobs", metavar="LIST", help="only these knobs, comma-separated (the table names them)")
    g.add_argument("--grid", action="store_true",
                   help="every combination of the knobs' values instead of the descent (slow; never saved)")
    g.add_argument("--no-save", action="store_true", help="measure and show, but leave the profile as it is")
    g.add_argument("--json", action="store_true", help="print everything measured as JSON instead of the table")
    p.set_defaults(func=cmd_tune)
