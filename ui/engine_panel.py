"""The live engine panel: what a 1.56 TB model streaming through a small machine is doing right now.
`Monitor` is written by the turn worker (it is an Observer of the turn's forward passes; plain
numbers only, never a Gradio object) and rendered to HTML by whoever polls it (a gr.Timer tick).
Speeds and bytes come from the engine's own counters and wall-clock stamps, memory from the OS, never from
estimates.
"""
from __future__ import annotations

import html
import threading
import time
from collections import deque

from k3core import Observer
from k3core.report.run import peak_rss_bytes, prompt_cache_text
from k3core.units import human

IO_KEYS = ("trunk_bytes_read", "expert_bytes_read", "expert_requests", "expert_hits", "tokens_forwarded")
HISTORY_TURNS = 40  # the turns the panel's plots keep (every conversation on this page, in order)


def _io(stats: dict) -> dict:
    return {k: stats.get(k, 0) for k in IO_KEYS}


def _minus(a: dict, b: dict) -> dict:
    return {k: a[k] - b[k] for k in IO_KEYS}


class Monitor(Observer):
    def __init__(self, host):
        self.host = host
        self._lock = threading.Lock()
        self.live: dict | None = None   # the turn running now
        self.last: dict | None = None   # the last turn that ended
        self.waiting = 0                # turns waiting for the engine lock
        self.history: deque = deque(maxlen=HISTORY_TURNS)  # a point per turn that ended: turn_point()

    def queued(self, delta: int) -> None:
        """A turn starts (+1) or stops (-1) waiting for the engine lock."""
        with self._lock:
            self.waiting += delta

    # ---- written by the turn worker (the thread that holds the engine lock) ----
    def begin(self, note: str = "", sampled: bool = True, speculating: bool = False) -> None:
        """A turn starts; `note` says what is unusual about it (e.g. a freed state being recomputed)."""
        s = _io(self.host.engine.stats())
        with self._lock:
            self.live = {"note": note, "sampled": sampled, "speculating": speculating, "t0": time.perf_counter(),
                         "passes": 0, "tokens": 0, "drafted": 0, "accepted": 0, "layer": 0,
                         "layers": self.host.engine.config.num_hidden_layers, "start": s, "first": None, "now": s,
                         "t_first": None, "t_token": None, "t_pass": None}

    def on_layer(self, layer: int, layers: int) -> None:
        """Observer.on_layer: a forward pass is at `layer` of `layers`; layer 0 starts a new pass."""
        live = self.live
        if live is None:
            return
        if layer == 0:
            with self._lock:
                live["passes"] += 1
                live["t_pass"] = time.perf_counter()
        live["layer"], live["layers"] = layer + 1, layers

    def on_token(self, token: int, logits) -> None:
        """Observer.on_token: the reply has one more token (with speculation, several can come from one pass)."""
        live = self.live
        if live is None:
            return
        now, s = time.perf_counter(), _io(self.host.engine.stats())
        with self._lock:
            live["tokens"] += 1
            if live["tokens"] == 1:  # the prompt pass is done: its output is the first token
                live["first"], live["t_first"] = s, now
            live["now"], live["t_token"] = s, now

    def on_draft(self, drafted: int, accepted: int) -> None:
        live = self.live
        if live is not None:
            with self._lock:
                live["drafted"] += drafted
                live["accepted"] += accepted

    def end(self, stats: dict | None, reason: str) -> None:
        """The turn is over: keep its numbers (ChatSession's stats when it finished)."""
        with self._lock:
            live, self.live = self.live, None
        if live is None:
            return
        s = _io(self.host.engine.stats())
        turn = _minus(s, live["start"])
        st = stats or {}
        prefill_io = _minus(live["first"], live["start"]) if live["first"] else turn
        n = st.get("generated_tokens", live["tokens"])
        decode_io = _minus(s, live["first"]) if live["first"] and n > 1 else None
        self.last = {"reason": reason, "sampled": live["sampled"], "generated": n,
                     "prefill_tokens": prefill_io["tokens_forwarded"], "prefill_seconds": st.get("prefill_seconds"),
                     "seconds_per_token": st.get("seconds_per_token"), "seed": st.get("seed"),
                     "prefill_io": prefill_io, "decode_io": decode_io, "turn_io": turn,
                     "reused": st.get("reused_tokens"), "speculating": live["speculating"],
                     "drafted": live["drafted"], "accepted": live["accepted"], "passes": live["passes"]}
        with self._lock:
            self.history.append(turn_point(self.last))

    # ---- read by anyone ----
    def snapshot(self) -> dict:
        with self._lock:
            live = dict(self.live) if self.live else None
            history = list(self.history)
        return {"live": live, "last": self.last, "waiting": self.waiting, "history": history}

    def render(self) -> str:
        try:
            self._html = render(self.host, self.snapshot())
        except Exception:  # noqa: BLE001 - e.g. the engine is being reopened: keep the last picture
            pass
        return getattr(self, "_html", "")


def turn_point(last: dict) -> dict:
    """What the plots keep of a turn: s/token, prompt ids per second, and bytes read from disk per reply token (by the
    reply's passes; None where the turn has no such figure)."""
    n, io = last["generated"], last["decode_io"]
    return {"seconds_per_token": last["seconds_per_token"],
            "prefill_rate": last["prefill_tokens"] / last["prefill_seconds"]
            if last["prefill_tokens"] and last["prefill_seconds"] else None,
            "read_per_token": (io["trunk_bytes_read"] + io["expert_bytes_read"]) / (n - 1) if io and n > 1 else None}


PLOTS = (("seconds_per_token", "s/token", lambda v: f"{v:.3g} s"),
         ("prefill_rate", "prefill", lambda v: f"{v:.3g} ids/s"),
         ("read_per_token", "disk read / token", human))
PLOT_W, PLOT_H = 180, 28


def sparkline(values: list) -> str:
    """An SVG line of `values` (None: a gap), scaled from their least to their most; a dot on the last one."""
    known = [v for v in values if v is not None]
    if not known:
        return ""
    low, high = min(known), max(known)
    step = PLOT_W / max(1, len(values) - 1)
    points = [(i * step, PLOT_H - 2 - (PLOT_H - 4) * ((v - low) / (high - low) if high > low else 0.5))
              for i, v in enumerate(values) if v is not None]
    line = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    x, y = points[-1]
    return (f'<svg class="k3-spark" width="{PLOT_W}" height="{PLOT_H}" viewBox="0 0 {PLOT_W} {PLOT_H}">'
            f'<polyline points="{line}" fill="none" stroke="currentColor" stroke-width="1.5"/>'
            f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="currentColor"/></svg>')


def plots(history: list[dict]) -> str:
    """Rows of the panel: each figure of the last turns as a line, with its last value and its range."""
    rows = []
    for key, name, show in PLOTS:
        values = [p[key] for p in history]
        known = [v for v in values if v is not None]
        if len(known) < 2:
            continue
        rows.append(f'<tr><th>{html.escape(name)}</th><td id="k3-plot-{key.replace("_", "-")}">'
                    f'{sparkline(values)}<br>last {show(known[-1])} · {show(min(known))} … {show(max(known))} over '
                    f'{len(values)} turns</td></tr>')
    return "".join(rows)


def _rate(tokens, seconds) -> str:
    if not tokens or not seconds:
        return "–"
    per_s = tokens / seconds
    return f"{per_s:.1f} tok/s" if per_s >= 1 else f"{seconds / tokens:.1f} s/token"


def _read(io: dict | None, per: int = 1) -> str:
    if not io:
        return "–"
    return f"{human(io['trunk_bytes_read'] / per)} trunk · {human(io['expert_bytes_read'] / per)} experts"


def _hits(io: dict | None) -> str:
    if not io or not io["expert_requests"]:
        return "–"
    return f"{100 * io['expert_hits'] / io['expert_requests']:.1f} % of {io['expert_requests']} expert reads"


def _drafts(d: dict) -> tuple[str, str, str]:
    share = f" ({100 * d['accepted'] / d['drafted']:.0f} %)" if d["drafted"] else ""
    return ("drafts accepted", f"{d['accepted']} of {d['drafted']}{share} · {d['passes']} passes for the prompt and "
                               f"{d['tokens'] if 'tokens' in d else d['generated']} tokens", "drafts")


def _status(live: dict | None, waiting: int) -> str:
    queue = f" · {waiting} waiting" if waiting else ""
    if live is None:
        return "idle" + queue
    elapsed = time.perf_counter() - (live["t_pass"] or live["t0"])
    what = "reading the prompt" if live["tokens"] == 0 else f"token {live['tokens'] + 1}"
    return (f"{what}: layer {live['layer']} / {live['layers']} ({elapsed:.1f} s){queue}"
            f'<br><progress value="{live["layer"]}" max="{live["layers"]}"></progress>')


def _live_rows(live: dict) -> list[tuple[str, str, str]]:
    generated = live["tokens"]
    rows = [("this turn", live["note"], "turn-note")] if live["note"] else []
    rows.append(("tokens so far", str(generated), "tokens"))
    first = live["first"]
    if first:
        prompt = _minus(first, live["start"])
        rows.append(("prefill", f"{prompt['tokens_forwarded']} tokens, "
                                f"{_rate(prompt['tokens_forwarded'], live['t_first'] - live['t0'])}", "prefill"))
        if generated > 1:
            rows.append(("decode", _rate(generated - 1, live["t_token"] - live["t_first"]), "decode"))
            rows.append(("read per token", _read(_minus(live["now"], first), generated - 1), "read"))
        else:
            rows.append(("read by the prompt pass", _read(prompt), "read"))
    if live["speculating"]:
        rows.append(_drafts(live))
    rows.append(("true hit rate", _hits(_minus(live["now"], live["start"])), "hits"))
    return rows


def _last_rows(last: dict) -> list[tuple[str, str, str]]:
    n, spt = last["generated"], last["seconds_per_token"]
    how = f"seed {last['seed']}" if last["sampled"] else "greedy"
    rows = [("last reply", f"{n} tokens ({last['reason']}), {how}", "tokens"),
            ("prefill", f"{last['prefill_tokens']} tokens, {_rate(last['prefill_tokens'], last['prefill_seconds'])}",
             "prefill"),
            ("decode", _rate(1, spt) if spt else "–", "decode")]
    if last["decode_io"]:
        rows.append(("read per token", _read(last["decode_io"], n - 1), "read"))
    else:
        rows.append(("read by the prompt pass", _read(last["prefill_io"]), "read"))
    if last["speculating"]:
        rows.append(_drafts(last))
    rows.append(("true hit rate", _hits(last["turn_io"]), "hits"))
    return rows


def rss_text(peak: int, outside: int, planned: int, available: int) -> str:
    """Peak RSS as what this process holds besides the engine (`outside`: Python, Gradio, the page, which no memory
    plan counts; EngineHost.rss_outside_engine) and the rest, which is what the plan's figure compares with. Both
    from the OS, never estimated."""
    rest = max(0, peak - outside)
    return (f"{human(peak)} = {human(outside)} without the engine (Python, Gradio, the page) + {human(rest)} more: "
            f"{100 * rest / planned:.0f} % of the {human(planned)} the plan holds; {human(available)} available")


def render(host, snap: dict) -> str:
    """The panel as an HTML table; each value cell has an id (k3-status, k3-tokens, …) for tests."""
    engine, live, last = host.engine, snap["live"], snap["last"]
    stats, plan, c = engine.stats(), engine.plan, engine.config
    rows = [("engine", None, "status")]
    rows += _live_rows(live) if live else _last_rows(last) if last else []
    rss, pinned, b = peak_rss_bytes(), stats.get("pinned_layers"), host.budget
    ring = f", ring of {stats['ring_slots']} slots" if stats.get("ring_slots") else ""
    draft = getattr(host, "draft", None)  # the draft source speculation uses (k3 ui --speculate), else None
    rows += [
        ("peak RSS", rss_text(rss, host.rss_outside_engine, plan.total, plan.available), "rss"),
        ("hit rate since start", _hits(_io(stats)), "hits-all"),
        ("pinned layers", f"{pinned} / {c.num_hidden_layers}{ring}" if pinned is not None else "–", "pinned"),
        ("read since start", _read(_io(stats)), "io"),
        ("budget", f"{b['preset']}: " + (f"trunk {b['trunk_gb']:g} GB, " if b["trunk"] and b["trunk_gb"] else
                                          "trunk held whole, " if not b["trunk"] else "")
         + f"expert cache {b['cache_gb']:g} GB", "budget"),
        ("engine plugins", f"{engine.kernels.name} kernels · {engine.placer.name} placer · {engine.store.name} store"
         + (f" · {draft} drafts" if draft else ""), "plugins"),
        ("prompt cache", prompt_cache_text(cache.stats()) if (cache := getattr(host, "prompt_cache", None)) else "off",
         "prompt-cache"),
    ]
    cells = []
    for name, value, elem in rows:
        shown = _status(live, snap["waiting"]) if value is None else html.escape(value)
        cells.append(f'<tr><th>{html.escape(name)}</th><td id="k3-{elem}">{shown}</td></tr>')
    return f'<table class="k3-panel">{"".join(cells)}{plots(snap.get("history", []))}</table>'
