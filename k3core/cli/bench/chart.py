"""`k3 bench project --chart FILE`: the projection's tables as one picture for README and docs — s/token by RAM
(the C engine's published figures, k3 serial with a raw and a lossless trunk, k3 with drafts per group of kinds),
and the time to the first token of a 2k, 30k and 47k-id prompt, cold and with its prefix cached. Drawn by
matplotlib (the `charts` extra: `pip install 'k3[charts]'`), never needed to run k3; the SVG carries no date and
fixed ids, so the same projection writes the same bytes.
"""
from __future__ import annotations

from pathlib import Path

from ...errors import UsageError

FORMATS = (".svg", ".png")


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--chart draws with matplotlib, which is not installed: pip install 'k3[charts]' (or "
                         "pip install matplotlib) in k3's environment, or leave out --chart") from None
    matplotlib.use("Agg")  # files only: no window, no display needed
    matplotlib.rcParams.update({"svg.hashsalt": "k3", "svg.fonttype": "none"})
    import matplotlib.pyplot as plt
    return plt


def write_chart(doc: dict, path: str) -> Path:
    """Draw `doc` (cmd_project's document) into `path` (.svg or .png), written whole or not at all."""
    out = Path(path)
    if out.suffix.lower() not in FORMATS:
        raise UsageError(f"--chart {path}: give a file ending in {' or '.join(FORMATS)}")
    plt = _pyplot()
    fig, (speed, first) = plt.subplots(1, 2, figsize=(12, 4.6), layout="constrained")
    _speed_panel(speed, doc)
    _first_token_panel(first, doc)
    fig.suptitle("full Kimi K3, projected from this machine's rates (k3 bench project) — not a measurement")
    tmp = out.with_name(out.name + ".tmp")
    try:
        fig.savefig(tmp, format=out.suffix[1:].lower(), metadata={"Date": None} if out.suffix.lower() == ".svg"
                    else {"Software": "k3"})
        tmp.replace(out)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise UsageError(f"--chart {path}: cannot write it ({exc.strerror or exc})") from None
    finally:
        plt.close(fig)
    return out


def _speed_panel(ax, doc: dict) -> None:
    ram = [r["ram"] / 1e9 for r in doc["rows"]]
    lines = {"C engine, published": [r["c_engine_seconds"] for r in doc["rows"]],
             "k3 serial, raw trunk": [r["raw"]["seconds_per_token"] for r in doc["rows"]],
             "k3 serial, lossless trunk": [r["lossless"]["seconds_per_token"] for r in doc["rows"]]}
    for group in doc["drafts"]:
        lines[f"k3 + {doc['draft_source']}, {group}"] = [r["speculation"][group]["seconds_per_token"]
                                                         for r in doc["rows"]]
    for label, seconds in lines.items():
        ax.plot(ram, seconds, marker="o", linestyle="--" if label.startswith("C engine") else "-", label=label)
    ax.set(xscale="log", xticks=ram, xticklabels=[f"{g:g} GB" for g in ram], xlabel="RAM",
           ylabel="seconds per token (lower is faster)", title="decode")
    ax.set_ylim(bottom=0)
    ax.minorticks_off()
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")


def _first_token_panel(ax, doc: dict) -> None:
    ram = [r["ram"] / 1e9 for r in doc["prompt"]]
    for i, n in enumerate(sorted({int(k) for r in doc["prompt"] for k in r["ttft"]})):
        for kind, style in (("cold", "-"), ("cached", ":")):  # a prompt's two lines in one colour
            ax.plot(ram, [r["ttft"][str(n)][kind] / 60 for r in doc["prompt"]], marker="o", linestyle=style,
                    color=f"C{i}", label=f"{n // 1000}k-id prompt, {kind}")
    ax.set(xscale="log", yscale="log", xticks=ram, xticklabels=[f"{g:g} GB" for g in ram], xlabel="RAM",
           ylabel="minutes to the first token", title="the prompt (cached: all but its last turn's ids)")
    ax.minorticks_off()
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
