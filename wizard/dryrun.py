"""`k3 setup --dry-run`: the plan without doing it: which files, how many bytes, the disk needed and whether it
fits, and how long each step should take from a measured network rate (one short ranged GET) and the
doctor's measured disk rate. Writes nothing but the disk test's temporary file, which it deletes.

Offline (the Hub unreachable, or HF_HUB_OFFLINE set) it plans with what it has: the sizes the last run recorded in
the destination, else, for moonshotai/Kimi-K3, the published shard sizes k3 ships; then it says what it could not
check. Exit 0 when that plan fits, 2 when it does not, or when there are no sizes at all to plan with.
"""
from __future__ import annotations


from k3core.machine.checks import measure_read

from .demo import demo_bytes
from .hub import UnreachableError
from .plan import (Plan, _existing, free_bytes, plan_demo, plan_hub, plan_local, plan_published, remaining_bytes,
                   space_check)
from .progress import estimate, hash_rate, human, pack_estimate, rate_text
from .state import STATE, read_state
from .verify import is_official

REFERENCE_RATE = 125e6     # 1 Gbit/s: the example rate an offline dry run gives the download time at


def dry_run(setup) -> int:
    s, o = setup, setup.opts
    s.say(f"k3 setup --dry-run: {s.src} -> {s.dest}  (nothing is written)")
    net, sha, unreachable, origin, from_hub = None, None, None, "", False
    if s.src.kind == "hf":
        hub, plan = s.hub(), None
        old = read_state(s.dest) if s.dest.is_dir() else None
        try:
            sha = hub.resolve(s.src.revision)
            plan = plan_hub(hub, sha, o.vision, o.jobs)
            from_hub = True
            if old and old.get("facts", {}).get("commit") == sha and old.get("files"):
                plan.files = old["files"]               # resuming: what is already there does not count again
            biggest = max((r for r in plan.files.values() if r["remote"]), key=lambda r: r["size"])
            net = hub.measure_rate(biggest["remote"], sha, biggest["size"])
        except UnreachableError as exc:         # offline: plan with what k3 has, and say what was not checked
            unreachable = exc
        if plan is None:
            plan, origin = offline_plan(s, old)
        resolved = f" = commit {sha}" if sha else ": not resolved to a commit (the Hub was not reached: see below)"
        s.say(f"  source       {s.src}@{s.src.revision}{resolved}  ({hub.endpoint})")
        if plan is None:
            return no_plan(s, unreachable)
    elif s.src.kind == "dir":
        plan = plan_local(s.dest)
        s.say(f"  source       the checkpoint in {s.dest}, used in place")
    else:
        plan = plan_demo()
        s.say(f"  source       the trained demo model shipped with k3 ({human(demo_bytes())}; not Kimi K3)")
    files = plan.files
    weights = [r for r in files.values() if r["kind"] in ("weights", "vision")]
    small = [r for r in files.values() if r["kind"] == "meta"]
    if files:
        small_text = (f"{len(small)} config/tokenizer file(s), {human(sum(r['size'] for r in small))}" if small or
                      not unreachable else "the config/tokenizer files (a few MB) only the Hub lists")
        s.say(f"  files        {len(weights)} weight shard(s), {human(sum(r['size'] for r in weights))}"
              f"{', ' + origin if origin else ''}; {small_text}")
    if plan.vision and not o.vision:
        left = f", {human(plan.vision_bytes)}" if plan.vision_bytes else ""
        s.say(f"  left out     {len(plan.vision)} vision shard(s){left} (--vision fetches them)")
    if plan.skipped:
        more = f" and {len(plan.skipped) - 6} more" if len(plan.skipped) > 6 else ""
        s.say(f"  not needed   {', '.join(plan.skipped[:6])}{more}")
    fetch = remaining_bytes(files) if s.src.kind == "hf" else (plan.fetch_bytes or 0)
    needs = [(s.dest, fetch, "checkpoint")] + ([] if o.no_pack else [(s.trunk, plan.trunk_bytes, "packed trunk")])
    fits, space = space_check(needs)
    s.say(f"  destination  {s.dest}" + ("" if o.no_pack else f"; packed trunk in {s.trunk}"))
    s.say(f"  disk         {space}")
    try:
        disk = measure_read(str(_existing(s.dest)), max(1, min(o.read_mb, 64)))["bytes_per_s"]
    except OSError:
        disk = None
    total = sum(r["size"] for r in files.values()) or fetch
    hashing = hash_rate(disk, o.jobs)
    network = (f"{rate_text(net)} (measured)" if net else "not measured (the Hub was not reached)" if unreachable
               else "not needed")
    s.say(f"  rates        network {network}, disk read {rate_text(disk) + ' (measured)' if disk else 'not measured'}")
    fetch_time = (estimate(fetch, net) if net or not unreachable
                  else f"time unknown offline; {estimate(fetch, REFERENCE_RATE)} at 1 Gbit/s")
    steps = [("machine check", "k3 doctor's checks", "a few s"),
             ("space", "the check above, again", "a few s"),
             ("download",
              f"{human(fetch)} in {o.jobs} parallel streams" if s.src.kind == "hf" else
              "copy the demo model and check each file's sha256" if s.src.kind == "demo" else "nothing: used in place",
              fetch_time if s.src.kind == "hf" else "a few s"),
             ("verify", f"re-read {human(total)}: size and hash of every file", estimate(total, hashing)),
             ("pack", "skipped (--no-pack)" if o.no_pack else f"{human(plan.trunk_bytes)} into {s.trunk}, codec "
              + ("chosen from the disk and CPU rates (raw or planes)" if o.codec == "auto" else o.codec),
              "instant" if o.no_pack else pack_estimate(plan.trunk_bytes, disk, o.codec)),
             ("profile", f"preset {o.preset}, saved for k3 run / k3 chat", "instant"),
             ("tune", "skipped (--no-tune)" if o.no_tune else "k3 tune: short exact trials, the fastest saved",
              "instant" if o.no_tune else f"at most {o.tune_minutes:g} min"),
             ("next", "print the command to run next", "instant")]
    for i, (name, what, when) in enumerate(steps, 1):
        s.say(f"  [{i}/{len(steps)}] {name:<13} {what} ({when})")
    if unreachable:
        not_checked(s, unreachable, sha, from_hub)
    if not fits:
        s.say("  -> would be refused before the first byte: not enough free space")
        return 2
    s.say(f"  -> run it{' once the Hub answers' if unreachable else ''}: {s.command()}")
    return 0


def offline_plan(s, old: dict | None) -> tuple[Plan | None, str]:
    """Without the Hub: the files the last run recorded in the destination (same source, revision and --vision),
    else the published shard sizes of the released checkpoint, else nothing; and where the sizes come from."""
    identity = {"source": str(s.src), "repo": s.src.repo, "revision": s.src.revision, "vision": s.opts.vision}
    if old and old.get("files") and all(old.get(k) == v for k, v in identity.items()):
        f = old.get("facts", {})
        plan = Plan(old["files"], f.get("trunk_bytes", 0), bool(f.get("official")), list(f.get("vision_shards", [])),
                    list(f.get("skipped", [])))
        commit = f" at commit {f['commit']}" if f.get("commit") else ""
        return plan, f"as the last run recorded them in {s.dest / STATE}{commit}"
    if is_official(s.src.repo):
        return plan_published(s.opts.vision), "by the published shard sizes k3 ships"
    return None, ""


def not_checked(s, unreachable: UnreachableError, sha: str | None, from_hub: bool) -> None:
    what = ([] if from_hub else ["the Hub's current file list"]) + \
        ([] if sha else [f"the commit {s.src.revision} points at now"]) + ["the network rate"]
    s.say(f"  not checked  {', '.join(what)}")
    s.say(f"               network {'not used' if unreachable.offline_mode else 'unreachable'}: {unreachable.reason}")


def no_plan(s, unreachable: UnreachableError) -> int:
    """Offline, for a repository whose sizes k3 does not ship and no earlier run recorded: what is known, exit 2."""
    s.say(f"  files        unknown: only the Hub lists the files of {s.src.repo} (k3 ships the shard sizes of the "
          "released moonshotai/Kimi-K3 alone)")
    s.say(f"  destination  {s.dest}")
    s.say(f"  disk         {human(free_bytes(s.dest))} free on {_existing(s.dest)}; what is needed is unknown without "
          "the file list")
    not_checked(s, unreachable, None, False)
    s.say("  -> no plan without the Hub's file list: run it again once the network is back")
    return 2
