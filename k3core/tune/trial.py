"""One trial of `k3 tune`: a setting's engine opened in a process of its own (so nothing one trial holds — the
expert cache, pages, the suffix index, a kernel backend's threads — carries into the next), the workload's prompts
run one after another with greedy sampling and no stop, and its ids and times reported back as JSON. The parent
waits for it; Ctrl-C stops the child with the parent.

The prompts' states: the first trial forwards them and keeps each (a disk prompt cache in `job["states"]`); a
trial that measures only the reply (`job["resume"]`) starts each prompt from its kept state — one id forwarded,
not the whole prompt, so a decode trial on a slow model costs its reply, not its prompt. A conversation trial
(`job["conversation"]`) sends the prompts as one conversation's turns, each with everything before it, and keeps
states only in the RAM its setting gives the prompt cache (EngineConfig.prompt_cache_gb). Every other trial
forwards its prompts from fresh states. A kept state gives the same ids as a forwarded one (the prompt cache's
contract), and every trial's ids are checked against the first's.

`python -m k3core.tune.trial` is the child: a job on stdin, one JSON line on stdout.
"""
from __future__ import annotations

import importlib
import json
import os
import signal
import subprocess
import sys
import time
from typing import Mapping

from ..errors import K3Error, PlanError, PluginError, UnsoundRunError, UsageError
from .search import Trial

# the exit code of a child whose plan did not fit: a setting the budget cannot hold, not a failure
DOES_NOT_FIT = 3


def run_job(job: Mapping) -> dict:
    """Open the engine of `job["config"]` and run its prompts; ids and timings."""
    from ..api import EngineConfig, SamplingParams, Session, open_engine, speculation
    from ..report.run import peak_rss_bytes

    plugins = [importlib.import_module(name) for name in job.get("plugins", ())]
    config = EngineConfig(**job["config"])
    spec = job.get("speculation")
    opened = time.perf_counter()
    with open_engine(config, plugins=plugins) as engine:
        load = time.perf_counter() - opened
        draft = speculation(spec["draft"], spec["k"], plugins=plugins) if spec else None
        states = kept_states(engine, job)
        ids, prefill, decode, tokens, prompt_ids, passes = [], 0.0, 0.0, 0, 0, 0
        started = time.perf_counter()
        for prompt in conversation(job, ids) if job.get("conversation") else job["prompts"]:
            session = Session(engine, prompt_cache=states)
            *_, done = session.generate(prompt, SamplingParams(max_tokens=job["reply"]), speculation=draft)
            s = done.stats
            ids.append(done.ids)
            prefill += s["prefill_seconds"]
            decode += s["stamps"][-1] - s["stamps"][0]
            tokens += len(done.ids) - 1
            prompt_ids += len(prompt)
            passes += s["forward_passes"]
        seconds = time.perf_counter() - started
        return {"ids": ids, "seconds": seconds, "load_seconds": load, "prefill_seconds": prefill,
                "decode_seconds": decode, "turn_seconds": prefill + decode,
                "seconds_per_token": decode / tokens if tokens else None,
                "prefill_ids_per_second": prompt_ids / prefill if prefill else None, "forward_passes": passes,
                "kernels": engine.kernels.name, "peak_rss_bytes": peak_rss_bytes()}


STATES_RAM, STATES_DISK = 256 << 20, 8 << 30  # the kept prompt states: RAM while a trial runs, disk at most


def conversation(job: Mapping, replies: list):
    """The prompts as one conversation's turns, each sent whole as an API client sends it: the turns before it, each
    with its reply (`replies` is filled as they are generated), then the prompt."""
    sent: list[int] = []
    for prompt in job["prompts"]:
        if replies:
            sent += replies[-1]
        sent += prompt
        yield list(sent)


def kept_states(engine, job: Mapping):
    """The prompt cache a trial runs with: for a conversation, the RAM the setting gives kept prompt states (None:
    none); otherwise the kept states to resume from (`resume`), the empty cache the first trial fills, or None (its
    prompts forwarded from fresh states)."""
    from ..api import PrefixCache

    where = job.get("states")
    try:
        if job.get("conversation"):
            ram = int(engine.config_in.prompt_cache_gb * 1e9)
            return PrefixCache(engine, ram) if ram else None
        if where is None or not (job.get("resume") or not any(os.scandir(where))):
            return None
        return PrefixCache(engine, STATES_RAM, disk_dir=where, disk_bytes=STATES_DISK)
    except PluginError:  # an attention backend that cannot keep its state: every trial forwards its prompts
        return None


def main() -> int:
    job = json.loads(sys.stdin.read())
    try:
        result = run_job(job)
    except PlanError as exc:
        print(json.dumps({"does_not_fit": str(exc).splitlines()[0]}))
        return DOES_NOT_FIT
    except K3Error as exc:
        print(json.dumps({"error": str(exc), "exit": exc.exit_code}))
        return exc.exit_code
    print(json.dumps(result))
    return 0


class TrialFailed(K3Error):
    """A trial's process failed for a reason other than its memory plan: a bug or a broken plugin, never a
    setting to skip."""

    exit_code = 1


def measure(job: Mapping, setting: Mapping, env: Mapping | None = None) -> Trial:
    """Run `job` in a child process; its Trial (a plan that does not fit: a skipped one)."""
    started = time.perf_counter()
    child = subprocess.Popen([sys.executable, "-m", "k3core.tune.trial"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, env={**os.environ, **(env or {})},
                             start_new_session=True)  # our Ctrl-C is handled here, and stops the child
    try:
        out, err = child.communicate(json.dumps(job).encode())
    except BaseException:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        raise
    took = time.perf_counter() - started
    try:
        result = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        result = {}
    if child.returncode == DOES_NOT_FIT and "does_not_fit" in result:
        return Trial(dict(setting), skipped=f"does not fit: {result['does_not_fit']}", took=took)
    if child.returncode != 0 or "ids" not in result:
        why = result.get("error") or err.decode(errors="replace").strip()[-1500:] or f"exit {child.returncode}"
        failure = {2: UsageError, 4: UnsoundRunError}.get(result.get("exit"), TrialFailed)
        raise failure(f"k3 tune: a trial failed ({why})")
    figures = {k: v for k, v in result.items() if k not in ("ids", "seconds")}
    return Trial(dict(setting), result["seconds"], tuple(tuple(i) for i in result["ids"]), figures, took=took)


if __name__ == "__main__":
    sys.exit(main())
