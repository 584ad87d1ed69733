"""`k3 setup`'s eight steps and the state machine that runs them: (1) machine check, (2) destination and
free space, (3) download (or copy the trained demo model), (4) verify, (5) pack the trunk, (6) profile, (7) a short
`k3 tune` (--no-tune skips it), (8) the next command. The first lines say where step 6 will save the profile,
outside the destination. Each step says what it will do and how long it should take, then its result; finished
steps are recorded in <dest>/.k3-setup.json, so a killed wizard run again continues where it stopped.
"""
from __future__ import annotations

import getpass
import logging
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from k3core import auto_preset, mem_available
from k3core.errors import K3Error, UsageError
from k3core.io.pack import pack as pack_trunk
from k3core.plan.profile import Profile, profile_path, save_profile
from k3core.machine import checks as machine
from k3core.machine.cost import choose_trunk_codec
from k3core.report.meters import PackMeter

from .download import Downloader
from .hub import Hub
from .demo import demo_bytes
from .local_files import derive_index, install_demo, measure_local
from .plan import parse_source, plan_demo, plan_hub, plan_local, preflight, remaining_bytes
from .progress import estimate, hash_rate, human, pack_estimate
from .state import PARTIAL_DIR, PENDING, VERIFIED, SetupState
from .verify import check_files, record_sums, table_problems

log = logging.getLogger("k3.setup")
STEPS = [("check", "machine check"), ("space", "destination and free space"), ("download", "download"),
         ("verify", "verify"), ("pack", "pack the trunk"), ("profile", "profile"), ("tune", "tune"),
         ("next", "next command")]


@dataclass
class Options:
    source: str = "hf://moonshotai/Kimi-K3"
    dest: str | None = None
    trunk_dir: str | None = None
    preset: str = "auto"
    vision: bool = False
    jobs: int = 4
    yes: bool = False
    dry_run: bool = False
    no_pack: bool = False
    codec: str = "auto"           # the packed trunk's codec: raw, planes, or auto (what this machine streams faster)
    tune_minutes: float = 2.0     # the last step's `k3 tune --minutes`
    no_tune: bool = False         # skip that step
    read_mb: int = 64
    stall: float = 60.0


class Setup:
    def __init__(self, opts: Options, out=None, err=None):
        self.opts, self.out, self.err = opts, out or sys.stdout, err or sys.stderr
        self.src = parse_source(opts.source)
        self.interactive = not opts.yes and sys.stdin is not None and sys.stdin.isatty()
        self._hub = None
        if self.src.kind == "dir":
            if opts.dest and Path(opts.dest).resolve() != self.src.path:
                raise UsageError("a local --source is used in place: leave out --dest (put the packed trunk "
                                 "elsewhere with --trunk-dir)")
            self.dest = self.src.path
        else:
            default = "demo-model" if self.src.kind == "demo" else self.src.repo.split("/")[1]
            self.dest = Path(opts.dest or self.ask(f"Destination directory [{default}]: ", default)).absolute()
        self.trunk = Path(opts.trunk_dir).absolute() if opts.trunk_dir else self.dest / "trunk"
        self.st: SetupState | None = None

    # ---- talking ------------------------------------------------------------------------------------
    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)

    def ask(self, question: str, default: str) -> str:
        if self.opts.yes:
            return default
        if not self.interactive:
            raise UsageError("no terminal to ask on: pass --yes (and --dest DIR) to run without questions")
        return input(question).strip() or default

    def hub(self) -> Hub:
        if self._hub is None:
            ask = (lambda: getpass.getpass("Hugging Face token (input hidden; or set HF_TOKEN): ").strip() or None)
            self._hub = Hub(self.src.repo, ask_token=ask if self.interactive else None)
        return self._hub

    def command(self) -> str:
        src = f"{self.src}@{self.src.revision}" if self.src.kind == "hf" and self.src.revision != "main" else self.src
        extra = (" --vision" if self.opts.vision else "") + (" --no-pack" if self.opts.no_pack else "") \
            + (f" --codec {self.opts.codec}" if self.opts.codec != "auto" else "")
        return f"k3 setup --source {shlex.quote(str(src))} --dest {shlex.quote(str(self.dest))} --yes{extra}"

    # ---- the state machine --------------------------------------------------------------------------
    def run(self) -> int:
        if self.opts.dry_run:
            from .dryrun import dry_run
            return dry_run(self)
        identity = {"source": str(self.src), "repo": self.src.repo, "revision": self.src.revision,
                    "vision": self.opts.vision}
        if self.dest.exists() and not self.dest.is_dir():
            raise UsageError(f"--dest {self.dest}: a file, not a directory; choose a directory (nothing was written)")
        try:
            self.dest.mkdir(parents=True, exist_ok=True)
            self.st = SetupState.open(self.dest, identity)
        except OSError as exc:  # read-only, a file where a parent directory should be, no space, ...
            raise UsageError(f"--dest {self.dest}: cannot write there ({exc.strerror}); k3 setup keeps its state in "
                             "the destination: choose one you can write to") from None
        self.st.set_facts(command=self.command())
        self.say(f"k3 setup: {self.src} -> {self.dest}  (state: {self.dest / '.k3-setup.json'})")
        self.say(f"          step 6 saves the profile (which model k3 run, chat and ui use) in {profile_path()}; "
                 "K3_CONFIG_DIR=DIR saves it in DIR instead")
        try:
            for i, (name, title) in enumerate(STEPS, 1):
                key = self.key(name)
                if done := self.st.step(name, key):
                    self.say(f"[{i}/{len(STEPS)}] {title}: done earlier: {done['result']}")
                    continue
                what, how_long = self.describe(name)
                self.say(f"[{i}/{len(STEPS)}] {title}: {what} ({how_long})")
                log.info("step %d/%d %s: started in %s", i, len(STEPS), name, self.dest)
                t0 = time.perf_counter()
                try:
                    result = getattr(self, f"step_{name}")()
                except Exception as exc:
                    self.st.log(f"step {name} failed: {type(exc).__name__}: {exc}")
                    log.info("step %d/%d %s failed: %s: %s", i, len(STEPS), name, type(exc).__name__, exc)  # said too
                    raise
                log.info("step %d/%d %s: done in %.1f s: %s", i, len(STEPS), name, time.perf_counter() - t0, result)
                self.say(f"      -> {result}  [{time.perf_counter() - t0:.1f} s]")
                self.st.finish(name, result, key)
        except KeyboardInterrupt:
            self.st.log("interrupted")
            print(f"\nk3 setup: interrupted; finished work is kept. To continue: {self.command()}", file=self.err)
            raise
        finally:
            self.st.close()
        return 0

    def key(self, name: str):
        if name == "pack":
            return "no-pack" if self.opts.no_pack else [str(self.trunk), self.opts.codec]
        if name in ("profile", "next"):
            return [self.opts.preset, None if self.opts.no_pack else str(self.trunk)]
        if name == "tune":
            return [self.opts.preset, None if self.opts.no_pack else str(self.trunk), not self.opts.no_tune]
        return None

    def describe(self, name: str) -> tuple[str, str]:
        f, files = self.st.facts, self.st.files
        disk = f.get("disk_rate")
        total = sum(r["size"] for r in files.values()) or f.get("fetch_bytes", 0)
        hashing = hash_rate(disk, self.opts.jobs)
        if name == "check":
            return "CPU and kernels, build flags, RAM -> preset, disk read speed, O_DIRECT (k3 doctor)", "a few s"
        if name == "space":
            what = {"hf": f"resolve {self.src.revision} to a commit, list the files, ",
                    "dir": "open the checkpoint with k3core, ", "demo": ""}[self.src.kind]
            return what + "check the checkpoint and packed trunk fit", "a few s"
        if name == "download":
            if self.src.kind == "dir":
                return "nothing to download: the checkpoint is used in place", "instant"
            if self.src.kind == "demo":
                return (f"copy the trained demo model ({human(demo_bytes())}, shipped with k3) and check each "
                        "file's sha256", "a few s")
            left = remaining_bytes(files)
            return (f"{len(files)} files, {human(left)} to fetch, {self.opts.jobs} at a time, resumable",
                    estimate(left, f.get("net_rate")))
        if name == "verify":
            todo = sum(r["size"] for r in files.values() if r["status"] != VERIFIED)
            return f"re-read every file: size and hash against the record{self.table_note()}", estimate(todo, hashing)
        if name == "pack":
            if self.opts.no_pack:
                return "skipped (--no-pack)", "instant"
            codec = "raw or planes, chosen from the disk and CPU rates" if self.opts.codec == "auto" \
                else self.opts.codec
            how_long = pack_estimate(f.get("trunk_bytes", total), disk, self.opts.codec)
            return f"k3 pack {self.dest} {self.trunk}, codec {codec}", how_long
        if name == "profile":
            return "choose a memory preset from RAM and save the profile k3 run / k3 chat use", "instant"
        if name == "tune":
            if self.opts.no_tune:
                return "skipped (--no-tune); `k3 tune` any time", "instant"
            return ("k3 tune: short exact trials of threads, ring, cache split, reads and drafts on this model, the "
                    "fastest saved in the profile", f"at most {self.opts.tune_minutes:g} min")
        return "print the command to run next", "instant"

    def table_note(self) -> str:
        return " and the published shard-size table" if self.st.facts.get("official") else ""

    # ---- (1) machine check -------------------------------------------------------------------------
    def step_check(self) -> str:
        target = machine.RELEASED  # the doctor sizes RAM, disk and streaming for what is being set up
        if self.src.kind == "demo":
            size = demo_bytes()
            target = machine.Target("demo model", size, size)
        checks = [c for c in machine.run_checks(str(self.dest), self.opts.read_mb, target) if c.name != "disk space"]
        width = max(len(c.name) for c in checks)
        for c in checks:
            self.say(f"      {c.status:<4}  {c.name:<{width}}  {c.finding}")
            if c.status != "ok":
                self.say(f"      {'':<4}  {'':<{width}}  fix: {c.fix}")
            if c.name == "disk read" and c.data.get("bytes_per_s"):
                self.st.set_facts(disk_rate=c.data["bytes_per_s"])
        counts = {s: sum(c.status == s for c in checks) for s in ("ok", "warn", "fail")}
        tail = "; fix each failure before `k3 run` (the download does not need it)" if counts["fail"] else ""
        return ", ".join(f"{n} {s}" for s, n in counts.items()) + tail

    # ---- (2) destination and free space ------------------------------------------------------------
    def step_space(self) -> str:
        head = ""
        if self.src.kind == "hf":
            sha = self.st.facts.get("commit") or self.hub().resolve(self.src.revision)
            self.st.set_facts(commit=sha, endpoint=self.hub().endpoint)
            if not self.st.files:
                plan = plan_hub(self.hub(), sha, self.opts.vision, self.opts.jobs)
                self.st.set_facts(**plan.facts())
                self.st.set_files(plan.files)
            f = self.st.facts
            head = (f"{self.src.revision} = commit {sha[:12]}; {len(self.st.files)} files"
                    + (f" ({len(f['vision_shards'])} vision shard(s) left out: --vision fetches them)"
                       if f["vision_shards"] and not self.opts.vision else "") + "; ")
        elif self.src.kind == "dir":
            plan = plan_local(self.dest)
            self.st.set_facts(**plan.facts())
            self.st.set_files({k: r for k, r in plan.files.items() if k not in self.st.files} | self.st.files)
            head = f"a K3 checkpoint, {len(self.st.files)} files, used in place; "
        else:
            plan = plan_demo()
            self.st.set_facts(**plan.facts(), fetch_bytes=plan.fetch_bytes)
        return head + preflight(self.space_needs())

    def space_needs(self) -> list:
        f = self.st.facts
        fetch = remaining_bytes(self.st.files) if self.src.kind == "hf" else (
            f.get("fetch_bytes", 0) if not self.st.files else 0)
        needs = [(self.dest, fetch, "checkpoint")]
        if not self.opts.no_pack and not self.st.step("pack", self.key("pack")):
            needs.append((self.trunk, f.get("trunk_bytes", 0), "packed trunk"))
        return needs

    # ---- (3) download / generate -------------------------------------------------------------------
    def step_download(self) -> str:
        if self.src.kind == "dir":
            return "nothing to download"
        if self.src.kind == "demo":
            summary = install_demo(self.dest, self.trunk, self.st, self.err)
            (self.dest / PARTIAL_DIR).rmdir()
            return summary
        preflight(self.space_needs())      # again: space may have gone since step 2, or since the last run
        left = remaining_bytes(self.st.files)
        if self.interactive and left and self.ask(f"      download {human(left)} into {self.dest} now? [Y/n] ",
                                                  "y").lower() not in ("y", "yes"):
            raise UsageError(f"stopped before downloading, as asked; to continue: {self.command()}")
        summary = self.downloader().run([k for k, r in self.st.files.items() if r["remote"]])
        derive_index(self.dest, self.st)
        try:
            (self.dest / PARTIAL_DIR).rmdir()      # empty once every file is in place
        except OSError:
            pass
        return summary

    def downloader(self) -> Downloader:
        return Downloader(self.hub(), self.st.facts["commit"], self.dest, self.st, jobs=self.opts.jobs,
                          stall=self.opts.stall, stream=self.err)

    # ---- (4) verify --------------------------------------------------------------------------------
    def step_verify(self) -> str:
        files = self.st.files
        if self.src.kind == "dir" and not any(r.get("sha256") or r.get("oid") for r in files.values()):
            return f"{measure_local(self.dest, self.st)}; {record_sums(self.dest, self.opts.jobs, self.err)}"
        refetched, sums = [], {}
        for attempt in (1, 2):
            todo = {k: r for k, r in files.items() if r["status"] != VERIFIED}
            bad = check_files(self.dest, todo, self.opts.jobs, self.err, sums=sums)
            if self.st.facts.get("official"):
                bad |= {k: v for k, v in table_problems({k: r["size"] for k, r in files.items()},
                                                        self.opts.vision).items() if k in files}
            for name in todo:
                if name not in bad:
                    self.st.update_file(name, status=VERIFIED)
            if not bad:
                break
            for name, problem in sorted(bad.items()):
                self.say(f"      BAD {name}: {problem}")
                self.st.log(f"verify: {name}: {problem}")
            if self.src.kind != "hf":
                raise K3Error(f"{len(bad)} file(s) differ from what was recorded when they were set up: "
                              f"{', '.join(sorted(bad))}; the directory changed or the disk is damaged")
            if attempt == 2:
                raise K3Error(f"{len(bad)} file(s) still bad after fetching them again: {', '.join(sorted(bad))}; "
                              "the Hub's copy or this disk is damaged")
            for name in bad:
                (self.dest / name).unlink(missing_ok=True)
                self.st.update_file(name, status=PENDING, bytes=0)
            self.say(f"      fetching only the bad file(s) again: {', '.join(sorted(bad))}")
            self.downloader().run([k for k in bad if files[k]["remote"]])
            derive_index(self.dest, self.st)
            refetched += sorted(bad)
        what = f"{len(files)} files match their size and hash{self.table_note()}"
        what += f"; fetched again: {', '.join(refetched)}" if refetched else ""
        return f"{what}; {record_sums(self.dest, self.opts.jobs, self.err, known=sums, records=files)}"

    # ---- (5) pack, (6) profile, (7) next -----------------------------------------------------------
    def step_pack(self) -> str:
        if self.opts.no_pack:
            return "skipped: the whole trunk will be held in RAM"
        codec = self.codec()
        meter = PackMeter(self.err)
        try:
            r = pack_trunk(self.dest, self.trunk, progress=meter, say=lambda msg: self.say(f"      {msg}"), codec=codec)
        finally:
            meter.close()
        return f"{self.trunk}: {r.runs} runs, {human(r.trunk_bytes)}, codec {codec} ({r.status})"

    def codec(self) -> str:
        """--codec, or for auto the codec this machine streams the full model faster with (said, with why)."""
        if self.opts.codec != "auto":
            return self.opts.codec
        disk = self.st.facts.get("disk_rate")
        if not disk:
            self.say("      codec raw: the machine check measured no disk read speed to choose by (--codec planes "
                     "packs losslessly in ~0.67x the bytes)")
            return "raw"
        choice = choose_trunk_codec(disk)
        size = sum(r["size"] for r in self.st.files.values()) if self.st.files else demo_bytes()
        fits = (f"; this model ({human(size)}) fits in RAM, so nothing of it streams and the codec changes only the "
                "trunk file's size" if machine.Target(str(self.src), size, size).in_ram else "")
        self.say(f"      codec {choice.codec}: {choice.why}{fits} (--codec raw|planes to choose yourself)")
        return choice.codec

    def step_profile(self) -> str:
        preset, why = self.opts.preset, "as asked"
        if preset == "auto":
            available = mem_available()
            try:
                preset, why = auto_preset(available), f"the largest that fits {human(available)} available"
            except K3Error:
                preset, why = "laptop", f"the smallest; {human(available)} available is less than it wants"
        sha = self.st.facts.get("commit")
        source = f"{self.src}@{sha}" if sha else str(self.src)
        trunk = None if self.opts.no_pack else str(self.trunk)
        path = save_profile(Profile(model=str(self.dest), trunk=trunk, preset=preset, source=source))
        return f"preset {preset} ({why}); saved {path}"

    def step_tune(self) -> str:
        """`k3 tune` in a process of its own (each of its trials runs the model), its lines shown as they come."""
        if self.opts.no_tune:
            return "skipped (--no-tune): `k3 tune` measures the fastest settings any time"
        cmd = [sys.executable, "-m", "k3core", "tune", "--minutes", f"{self.opts.tune_minutes:g}"]
        with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as child:
            lines = []
            for line in child.stdout:
                lines.append(line.rstrip("\n"))
                self.say(f"      {lines[-1]}")
        if child.returncode != 0:
            raise K3Error(f"k3 tune stopped (exit {child.returncode}): {lines[-1] if lines else 'no output'}; the "
                          "setup is usable untuned (run `k3 tune` again, or `k3 setup ... --no-tune`)")
        winner = next((line for line in lines if line.startswith("winner: ")), "winner: see `k3 doctor`")
        return winner.removeprefix("winner: ") + "; saved in the profile"

    def step_next(self) -> str:
        k3, activate = k3_command()
        self.say(f"      {k3} chat                                              # talk to it (uses the saved profile)")
        self.say(f'      {k3} run --chat "What is the capital of France?"          # one question, one answer')
        self.say(f"      {k3} verify {self.dest}   # re-check every file, any time")
        if activate:
            self.say(f"      (`k3` alone is not on this shell's PATH: `source {activate}` puts it there)")
        return f"{k3} chat"


def k3_command() -> tuple[str, str | None]:
    """How this shell starts this install's k3: `k3` when the PATH finds this very one, else its path (relative
    when it lies under the current directory, as `.venv/bin/k3` after `make demo`); and the activate script that
    would put it on the PATH, when there is one to name."""
    mine = Path(sys.executable).parent / "k3"
    found = shutil.which("k3")
    if found and Path(found).resolve() == mine.resolve():
        return "k3", None
    try:
        shown = str(mine.relative_to(Path.cwd()))
    except ValueError:
        shown = str(mine)
    activate = mine.with_name("activate")
    return shlex.quote(shown), (shlex.quote(str(activate.relative_to(Path.cwd()) if activate.is_relative_to(Path.cwd())
                                                else activate)) if activate.is_file() else None)
