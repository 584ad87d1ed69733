"""The Setup tab: the setup wizard's eight steps (wizard.steps.Setup: the same code and the same
<dest>/.k3-setup.json as `k3 setup`) run from the browser on a worker thread. The wizard's output
streams into the page and each step's state is read back from the state file, so a run stopped
anywhere, here or in a terminal, resumes from either. "Use the saved profile" then reopens the engine
on what the wizard set up. Without the wizard package installed the tab only says so.
"""
from __future__ import annotations

import io
import threading
import time

import gradio as gr

from k3core.errors import K3Error, UsageError
from k3core.io.codec import CODECS as TRUNK_CODECS

from .guard import ADMIN_FLAG

CODEC_CHOICES = ("auto", *TRUNK_CODECS)

try:
    from wizard.state import read_state
    from wizard.steps import STEPS, Options, Setup
except ImportError:  # a build without the wizard
    Setup = None

PRESETS = ["auto", "laptop", "desktop", "workstation", "server", "max"]


class Sink(io.TextIOBase):
    """A stream the wizard prints to (not a terminal, so it prints plain lines); keeps the last lines."""

    def __init__(self, keep: int = 400):
        self.lines, self.keep, self._part, self._lock = [], keep, "", threading.Lock()

    def write(self, s: str) -> int:
        with self._lock:
            parts = (self._part + s).split("\n")
            self._part = parts.pop()
            self.lines = (self.lines + parts)[-self.keep:]
        return len(s)

    def isatty(self) -> bool:
        return False

    def text(self) -> str:
        with self._lock:
            return "\n".join(self.lines + ([self._part] if self._part else []))


def steps_table(guard, dest: str | None, running: bool = False) -> str:
    """The eight steps as the state file of `dest` (inside the models root) records them; the first unfinished
    one is running (if a run is)."""
    try:
        state = read_state(guard._inside(dest, "destination")) if (dest or "").strip() else None
    except K3Error as exc:
        return f"⚠ {exc}"
    steps = (state or {}).get("steps", {})
    rows, current = ["| | step | result |", "|---|---|---|"], running
    for i, (name, title) in enumerate(STEPS, 1):
        rec = steps.get(name)
        if rec:
            mark, result = "✓", rec.get("result", "")
        elif current:
            mark, result, current = "▶", "running…", False
        else:
            mark, result = "·", ""
        rows.append(f"| {mark} | {i}. {title} | {result.replace('|', '/')} |")
    where = f"state file: `{guard._inside(dest, 'destination') / '.k3-setup.json'}`" if state else \
        "no setup started in this directory yet"
    return "\n".join(rows) + f"\n\n{where}"


def run_setup(guard, source: str, dest: str, trunk_dir: str, preset: str, no_pack: bool, vision: bool, jobs: int,
              codec: str = "auto", poll: float = 0.5, no_tune: bool = False):
    """Run (or resume) the wizard where `guard` allows; yields (steps table, output so far, status line)."""
    sink = Sink()
    try:
        if codec not in CODEC_CHOICES:
            raise UsageError(f"codec {codec!r} is not one of {', '.join(CODEC_CHOICES)}")
        where_to, trunk = guard.destination(source, dest, trunk_dir)  # refused: nothing is created
        opts = Options(source=(source or "").strip() or "demo", dest=str(where_to), trunk_dir=str(trunk),
                       preset=preset, vision=bool(vision), jobs=max(1, min(16, int(jobs))), yes=True,
                       no_pack=bool(no_pack), codec=codec, no_tune=bool(no_tune))
        setup = Setup(opts, out=sink, err=sink)
    except (K3Error, ValueError, TypeError) as exc:
        yield steps_table(guard, dest), "", f"⚠ {exc}"
        return
    where, outcome = str(setup.dest), {}

    def work():
        try:
            outcome["code"] = setup.run()
        except K3Error as exc:
            outcome["error"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - shown in the page; finished steps are kept
            outcome["error"] = f"{type(exc).__name__}: {exc}"

    worker = threading.Thread(target=work, name="k3-setup", daemon=True)
    worker.start()
    while worker.is_alive():
        yield steps_table(guard, where, running=True), sink.text(), f"running in {where}…"
        time.sleep(poll)
    if "error" in outcome:
        status = f"⚠ stopped: {outcome['error']} — finished steps are kept; Run again to resume"
    else:
        status = "✓ done: the profile is saved. Use it now below, or restart `k3 ui`."
    yield steps_table(guard, where), sink.text(), status


def setup_tab(host, chats, title, header, tab, guard) -> None:
    """`title`: the page's header Markdown, redrawn by `header(host)` when another model is opened;
    `tab`: this tab, whose selection redraws the steps from the destination's state file; `guard`: what
    clients may do (ui/guard.py)."""
    if Setup is None:
        gr.Markdown("The setup wizard (`k3 setup`) is not installed in this build.", elem_id="k3-setup")
        return
    gr.Markdown("The same eight steps as `k3 setup`, sharing its state file: stop anywhere (here or in a "
                "terminal) and run again to resume. A Hugging Face token comes from `HF_TOKEN` or `hf auth login` "
                "in the environment `k3 ui` was started from; it is never asked for here. "
                f"Everything is written under the models root `{guard.models_root}`.")
    if not guard.admin:
        gr.Markdown(f"**Off on this page**: Setup writes files and opening a model changes what every session "
                    f"sees. Start `k3 ui {ADMIN_FLAG}` (or with `--auth`) to allow them.", elem_id="k3-setup-off")
    with gr.Row():
        with gr.Column(scale=1):
            source = gr.Textbox("demo", label="Source", elem_id="k3-setup-source",
                                info="demo or hf://OWNER/NAME[@REVISION] (a local checkpoint: `k3 setup` in a terminal)")
            default_dest = "demo-model"
            dest = gr.Textbox(default_dest, label="Destination", elem_id="k3-setup-dest",
                              info=f"a directory under {guard.models_root}")
            trunk_dir = gr.Textbox(label="Packed trunk directory", placeholder="DEST/trunk")
            preset = gr.Dropdown(PRESETS, value="auto", label="Memory preset saved in the profile")
            with gr.Row():
                no_pack = gr.Checkbox(False, label="Skip packing")
                vision = gr.Checkbox(False, label="Vision shards too")
                no_tune = gr.Checkbox(False, label="Skip the tune", info="the last step times settings for a few "
                                                                          "minutes; `k3 tune` any time")
            codec = gr.Dropdown(list(CODEC_CHOICES), value="auto", label="Packed trunk codec",
                                info="auto: planes (lossless, ~0.67× the bytes) where this machine's cores restore "
                                     "faster than its disk saves; else raw")
            jobs = gr.Slider(1, 16, value=4, step=1, label="Files in parallel")
            show = gr.Button("Show progress", elem_id="k3-setup-show")
            run = gr.Button("Run / resume", variant="primary", elem_id="k3-setup-run", interactive=guard.admin)
            use = gr.Button("Use the saved profile now (reopens the engine)", elem_id="k3-setup-use",
                            interactive=guard.admin)
            if not guard.admin:  # the buttons are greyed out: say why beside them, and how to allow them
                gr.Markdown(f"Run / resume and Use are off: Setup writes files and opening a model changes what "
                            f"every session sees. Start `k3 ui {ADMIN_FLAG}` (or with `--auth USER:PASSWORD`) to "
                            f"allow them.", elem_id="k3-setup-why", elem_classes="k3-off")
        with gr.Column(scale=2):
            status = gr.Markdown(elem_id="k3-setup-status")
            table = gr.Markdown(steps_table(guard, default_dest), elem_id="k3-setup-steps")  # what is there now
            log = gr.Textbox(label="Wizard output", lines=14, max_lines=14, autoscroll=True, interactive=False,
                             elem_id="k3-setup-log")

    def use_fn():
        try:
            guard.check_admin("Opening the saved profile for every session")
            host.open_profile()
        except K3Error as exc:
            return f"⚠ {exc}", gr.skip()
        chats.reset_all("a new model was opened: this is a new conversation")
        return f"✓ now serving {host.model}", header(host)

    def setup_fn(source_, dest_, trunk_dir_, preset_, no_pack_, vision_, jobs_, codec_="auto", no_tune_=False):
        yield from run_setup(guard, source_, dest_, trunk_dir_, preset_, no_pack_, vision_, jobs_, codec_,
                             no_tune=no_tune_)

    def table_fn(dest_):
        return steps_table(guard, dest_)

    run.click(setup_fn, [source, dest, trunk_dir, preset, no_pack, vision, jobs, codec, no_tune], [table, log, status],
              api_name="setup", concurrency_limit=1, concurrency_id="setup")
    show.click(table_fn, dest, table, api_visibility="private", concurrency_limit=None)
    dest.change(table_fn, dest, table, api_visibility="private", concurrency_limit=None)
    tab.select(table_fn, dest, table, api_visibility="private", concurrency_limit=None)
    use.click(use_fn, None, [status, title], api_name="use_profile", concurrency_limit=1, concurrency_id="engine")
