"""What `k3 run` prints. With `--chat --thinking` the reasoning and the answer read apart without colour — a
'thinking:' line over the reasoning and, once the answer starts, a blank line and 'answer:', both on stderr, so
stdout holds the answer alone. Its report counts memory in the decimal units of k3core.units.human, as `k3 chat`
and the page do, and says what a TRUE hit is; --quiet leaves the reply and what the model is (issue 42)."""
from __future__ import annotations

import re

from k3core.cli.main import main

from ..conftest import DEMO_MODEL


def test_thinking_and_answer_are_labelled_apart(capsys):
    code = main(["run", str(DEMO_MODEL), "--chat", "--thinking", "What is 6 + 7?", "--max-tokens", "60", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0 and out == "6 + 7 = 13.\n"
    assert err.endswith("thinking:\nI work out 6 + 7: the result is 13.\n\nanswer:\n"), err


def test_an_instruct_reply_has_no_labels(capsys):
    code = main(["run", str(DEMO_MODEL), "--chat", "What is 6 + 7?", "--max-tokens", "40", "--quiet"])
    out, err = capsys.readouterr()
    assert code == 0 and out == "6 + 7 = 13.\n" and "thinking:" not in err and "answer:" not in err


def test_the_report_counts_memory_in_the_units_the_page_uses(capsys):
    assert main(["run", str(DEMO_MODEL), "--chat", "Hi", "--max-tokens", "4"]) == 0
    err = capsys.readouterr().err
    assert re.search(r"; peak RSS \d+(\.\d+)? [kMG]B\n", err) and "MiB" not in err, err


def test_quiet_prints_the_reply_and_what_the_model_is_no_plan_nor_report(capsys):
    assert main(["run", str(DEMO_MODEL), "--chat", "What is the capital of France?", "--max-tokens", "40",
                 "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert out == "The capital of France is Paris.\n"
    assert err == (f"k3: {DEMO_MODEL} is the k3 demo model: a tiny model with the Kimi K3 architecture, trained to "
                   "answer capitals, small sums, colours, opposites and greetings, and to write short JSON and tool "
                   "calls; it is not Kimi K3\n")


def test_the_report_says_what_a_true_hit_is():
    from k3core.report.run import experts_part

    report = {"expert_requests": 140, "expert_true_hit_rate": 101 / 140, "expert_retention": 1.0,
              "expert_bytes_read": 2e5, "expert_read_rate": 4e7}
    assert experts_part(report) == ("experts: 140 requests, TRUE hits 72.1 % (resident before the request, not read "
                                    "for it), retention 100.0 %, read 0.000 GB at 0.04 GB/s")
