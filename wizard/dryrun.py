"""`k3 setup --dry-run`: the plan without doing it: which files, how many bytes, the disk needed and whether it
fits, and how long each step should take from a measured network rate (one short ranged GET) and the
doctor's measured disk rate. Writes nothing but the disk test's temporary file, which it deletes.
"""
from __future__ import annotations


from k3core.machine.checks import measure_read

from .plan import _existing, plan_demo, plan_hub, plan_local, remaining_bytes, space_check
from .progress import estimate, hash_rate, human, rate_text
from .state import read_state


def dry_run(setup) -> int:
    s, o = setup, setup.opts
    s.say(f"k3 setup --dry-run: {s.src} -> {s.dest}  (nothing is written)")
    net, sha = None, None
    if s.src.kind == "hf":
        hub = s.hub()
        sha = hub.resolve(s.src.revision)
        plan = plan_hub(hub, sha, o.vision, o.jobs)
        old = read_state(s.dest) if s.dest.is_dir() else None
        if old and old.get("facts", {}).get("commit") == sha and old.get("files"):
            plan.files = old["files"]               # resuming: what is already there does not count again
        biggest = max((r for r in plan.files.values() if r["remote"]), key=lambda r: r["size"])
        net = hub.measure_rate(biggest["remote"], sha, biggest["size"])
        s.say(f"  source       {s.src}@{s.src.revision} = commit {sha}  ({hub.endpoint})")
    elif s.src.kind == "dir":
        plan = plan_local(s.dest)
        s.say(f"  source       the checkpoint in {s.dest}, used in place")
    else:
        plan = plan_demo()
        s.say("  source       the built-in demo model (generated: small shape, seed 0)")
    files = plan.files
    weights = [r for r in files.values() if r["kind"] in ("weights", "vision")]
    small = [r for r in files.values() if r["kind"] == "meta"]
    if files:
        s.say(f"  files        {len(weights)} weight shard(s), {human(sum(r['size'] for r in weights))}; "
              f"{len(small)} config/tokenizer file(s), {human(sum(r['size'] for r in small))}")
    if plan.vision and not o.vision:
        s.say(f"  left out     {len(plan.vision)} vision shard(s), {human(plan.vision_bytes)} (--vision fetches them)")
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
    s.say(f"  rates        network {rate_text(net) if net else 'not needed'} (measured), disk read "
          f"{rate_text(disk) if disk else 'not measured'} (measured)")
    steps = [("machine check", "k3 doctor's checks", "a few s"),
             ("space", "the check above, again", "a few s"),
             ("download" if s.src.kind == "hf" else "generate" if s.src.kind == "demo" else "download",
              f"{human(fetch)} in {o.jobs} parallel streams" if s.src.kind == "hf" else
              "the demo model" if s.src.kind == "demo" else "nothing: used in place",
              estimate(fetch, net) if s.src.kind == "hf" else "a few s"),
             ("verify", f"re-read {human(total)}: size and hash of every file", estimate(total, hashing)),
             ("pack", "skipped (--no-pack)" if o.no_pack else f"{human(plan.trunk_bytes)} into {s.trunk}, codec "
              + ("chosen from the disk and CPU rates (raw or planes)" if o.codec == "auto" else o.codec),
              "instant" if o.no_pack else estimate(2 * plan.trunk_bytes, disk)),
             ("profile", f"preset {o.preset}, saved for k3 run / k3 chat", "instant"),
             ("next", "print the command to run next", "instant")]
    for i, (name, what, when) in enumerate(steps, 1):
        s.say(f"  [{i}/7] {name:<13} {what} ({when})")
    if not fits:
        s.say("  -> would be refused before the first byte: not enough free space")
        return 2
    s.say(f"  -> run it: {s.command()}")
    return 0
