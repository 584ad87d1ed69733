"""The memory plan as a picture for the Memory tab: one bar as wide as the memory the plan may use, each row of the
plan a segment of it coloured by what holds it (the trunk, the experts, decode state and buffers), the room left
after it, and — when the plan does not fit — what is over, past a line at what is available. The plan's text stays
below it for the figures; this only shows where the budget goes against what the machine has.
"""
from __future__ import annotations

from html import escape

from k3core.units import human

COLOURS = {"trunk": "#3b82f6", "experts": "#f59e0b", "state": "#10b981"}  # a row's part of the plan -> its colour
LEFT, OVER = "#e5e7eb", "#ef4444"  # the room left; what does not fit
SMALLEST = 0.004  # rows under this share of the bar are drawn together as one "other" segment of their part


def _segments(plan) -> list[tuple[str, str, int]]:
    """(label, colour, bytes) for each row worth a segment, in the plan's order; the small rows of each part as one."""
    scale = max(plan.total, plan.available, 1)
    out = []
    for part in ("trunk", "experts", "state"):
        rows = getattr(plan, part)
        small = [r for r in rows if r.bytes / scale < SMALLEST]
        out += [(r.item, COLOURS[part], r.bytes) for r in rows if r not in small and r.bytes > 0]
        if sum(r.bytes for r in small):
            label = small[0].item if len(small) == 1 else f"{len(small)} small {part} rows"
            out.append((label, COLOURS[part], sum(r.bytes for r in small)))
    return out


def plan_picture(plan) -> str:
    """HTML: the bar, a line under it saying the total against what is available, and a legend of the segments."""
    scale = max(plan.total, plan.available, 1)
    segments = _segments(plan)
    bars = [_bar(label, colour, size, scale) for label, colour, size in segments]
    if plan.fits:
        bars.append(_bar("left", LEFT, plan.available - plan.total, scale))
    marker = "" if plan.fits else (f'<div class="k3-plan-limit" style="left:{100 * plan.available / scale:.2f}%" '
                                   f'title="available: {human(plan.available)}"></div>')
    if plan.fits:
        verdict = (f"{human(plan.total)} planned of {human(plan.available)} available "
                   f"({human(plan.available - plan.total)} left)")
    else:
        verdict = (f"{human(plan.total)} planned: {human(plan.total - plan.available)} more than the "
                   f"{human(plan.available)} available — does NOT fit")
    legend = "".join(f'<span class="k3-plan-key"><i style="background:{c}"></i>{escape(label)} {human(size)}</span>'
                     for label, c, size in segments)
    return (f'<div class="k3-plan-picture" role="img" aria-label="{escape(verdict)}">'
            f'<div class="k3-plan-bar">{"".join(bars)}{marker}</div>'
            f'<div class="k3-plan-verdict" style="color:{"inherit" if plan.fits else OVER}">{escape(verdict)}</div>'
            f'<div class="k3-plan-legend">{legend}</div></div>')


def _bar(label: str, colour: str, size: int, scale: int) -> str:
    return (f'<div class="k3-plan-seg" style="width:{100 * size / scale:.3f}%;background:{colour}" '
            f'title="{escape(label)}: {human(size)}"></div>')


CSS = """
.k3-plan-bar { position: relative; display: flex; height: 28px; border-radius: 4px; overflow: hidden;
               border: 1px solid #9ca3af; }
.k3-plan-seg { height: 100%; border-right: 1px solid rgba(255,255,255,.6); }
.k3-plan-limit { position: absolute; top: 0; bottom: 0; border-left: 3px solid #ef4444; }
.k3-plan-verdict { margin: 4px 0; font-size: 0.95em; }
.k3-plan-key { display: inline-block; margin-right: 12px; font-size: 0.85em; white-space: nowrap; }
.k3-plan-key i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; }
"""
