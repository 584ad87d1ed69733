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
    assert 0 < host.rss_outside_engine <= peak_rss_bytes() and 0 < rss_bytes() <= peak_rss_bytes()
    shown = re.search(r'id="k3-rss">([^<]*)<', Monitor(host).render()).group(1)
    assert re.fullmatch(r"\S+ [kMG]B = \S+ [kMG]B without the engine \(Python, Gradio, the page\) \+ \S+ [kMG]?B "
                        r"more: \d+ % of the \S+ [kMG]B the plan holds; \S+ [kMG]B available", shown), shown
