"""What `k3 run` prints. With `--chat --thinking` the reasoning and the answer read apart without colour — a
'thinking:' line over the reasoning and, once the answer starts, a blank line and 'answer:', both on stderr, so
stdout holds the answer alone. Its report counts memory in the decimal units of k3core.units.human, as `k3 chat`
and the page do."""
from __future__ import annotations

import re

from k3core.cli.main import main

from .conftest import DEMO_MODEL


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
