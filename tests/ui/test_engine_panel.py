"""The engine panel's memory row (issue 42): peak RSS, from the OS, as what the page's process holds without the
engine (Python, Gradio, the page: no memory plan counts them) and the rest, which is what the plan's figure is
compared with — not the whole process against the plan, which read as a plan broken by 283 %."""
from __future__ import annotations

import re

from k3core.report.run import peak_rss_bytes, rss_bytes
from ui.engine_panel import Monitor, rss_text


def test_peak_rss_is_split_into_the_page_and_the_rest_against_the_plan():
    assert rss_text(778_000_000, 503_000_000, 275_000_000, 24_500_000_000) == (
        "778 MB = 503 MB without the engine (Python, Gradio, the page) + 275 MB more: 100 % of the 275 MB the plan "
        "holds; 24.5 GB available")


def test_the_panel_shows_the_split_measured_by_the_os(host):
    # Linux keeps a process's resident pages in per-CPU counters and reads them approximately: /proc/self/statm
    # can run a few pages ahead of the peak getrusage reports (seen: 32 KB), never megabytes.
    slack = 1 << 20
    assert 0 < host.rss_outside_engine <= peak_rss_bytes() + slack and 0 < rss_bytes() <= peak_rss_bytes() + slack
    shown = re.search(r'id="k3-rss">([^<]*)<', Monitor(host).render()).group(1)
    assert re.fullmatch(r"\S+ [kMG]B = \S+ [kMG]B without the engine \(Python, Gradio, the page\) \+ \S+ [kMG]?B "
                        r"more: \d+ % of the \S+ [kMG]B the plan holds; \S+ [kMG]B available", shown), shown


def test_the_panel_plots_each_turn_s_speed_and_reads_over_the_recent_turns():
    from ui.engine_panel import plots, turn_point

    def last(spt, prompt_ids, prompt_s, generated, read):
        io = {"trunk_bytes_read": read, "expert_bytes_read": 0} if generated > 1 else None
        return {"seconds_per_token": spt, "prefill_tokens": prompt_ids, "prefill_seconds": prompt_s,
                "generated": generated, "decode_io": io}

    history = [turn_point(last(0.5, 100, 2.0, 11, 10e9)), turn_point(last(None, 40, 1.0, 1, 0)),
               turn_point(last(0.25, 0, 0.0, 5, 2e9))]
    assert history[0] == {"seconds_per_token": 0.5, "prefill_rate": 50.0, "read_per_token": 1e9}
    assert history[1]["seconds_per_token"] is None and history[2]["prefill_rate"] is None
    shown = plots(history)
    spt = re.search(r'id="k3-plot-seconds-per-token">(.*?)</td>', shown).group(1)
    assert spt.count("<polyline") == 1 and "last 0.25 s · 0.25 s … 0.5 s over 3 turns" in spt
    assert 'points="0.0,26.0 180.0,2.0"' not in spt and 'points="0.0,2.0 180.0,26.0"' in spt  # slower is higher
    assert "last 500 MB · 500 MB … 1 GB over 3 turns" in shown
    assert "last 40 ids/s · 40 ids/s … 50 ids/s over 3 turns" in shown  # the turn without a rate: a gap
    assert "k3-plot" not in plots(history[:1])  # one point is no line yet


def test_every_turn_that_ends_is_a_point_the_last_forty_kept(host):
    from ui.engine_panel import HISTORY_TURNS

    monitor = Monitor(host)
    for _ in range(HISTORY_TURNS + 2):
        monitor.begin()
        monitor.end({"generated_tokens": 1, "prefill_seconds": 0.5, "seconds_per_token": None}, "stop")
    history = monitor.snapshot()["history"]
    assert len(history) == HISTORY_TURNS and history[-1]["seconds_per_token"] is None
