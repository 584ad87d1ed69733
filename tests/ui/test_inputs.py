"""What the page refuses from a client (ui/inputs.py, the Seed field in ui/app.py): each control's values checked
before Gradio's own preprocessing, with a message naming the field; the Seed field takes 0..2**64-1 or nothing.
Live over HTTP, with the log and the page, in the ui rows of tests/faults/test_clients.py."""
from __future__ import annotations

import logging

import gradio as gr
import pytest

from ui.app import SEED_MAX, parse_seed, sampling
from ui.inputs import Refused, problem, refuse


@pytest.mark.parametrize("seed, value", [("", None), (None, None), ("  ", None), ("0", 0), (" 42 ", 42), (7, 7),
                                         (str(SEED_MAX), SEED_MAX)])
def test_a_seed_is_empty_or_a_whole_number_in_range(seed, value):
    assert parse_seed(seed) == value


@pytest.mark.parametrize("seed", ["abc", "1e99", "-1", "1.5", str(2**64), "9" * 5000, "\u0663", "0x10", True])
def test_any_other_seed_is_refused_naming_the_field_and_its_range(seed):
    with pytest.raises(Refused) as refused:
        parse_seed(seed)
    assert refused.value.message.startswith(f"Seed: give a whole number from 0 to {SEED_MAX}")
    assert refused.value.print_exception is False and len(refused.value.message) < 200


def test_sampling_parameters_the_engine_refuses_are_refused_as_such():
    with pytest.raises(Refused, match="temperature must be 0"):
        sampling(1e-7, 1.0, 0, 4, "")


def test_a_refusal_is_one_log_line(caplog):
    with caplog.at_level(logging.WARNING, logger="k3.ui"):
        refuse("Seed: give a whole number\nbut got 'a\nb'", "/send")
    assert [r.getMessage() for r in caplog.records] == \
        ["refused a client's input to /send: Seed: give a whole number but got 'a b'"]
    assert not caplog.records[0].exc_info


def test_each_control_says_what_it_takes():
    with gr.Blocks():
        slider = gr.Slider(0, 2, label="Temperature")
        number = gr.Number(label="Expert cache GB", minimum=0)
        dropdown = gr.Dropdown(["auto", "laptop"], label="Preset")
        checkbox = gr.Checkbox(label="Skip packing")
        text = gr.Textbox(label="Seed")
    for value in (0, 1.5, 2):
        assert problem(slider, value) is None
    for value in ("abc", None, True, -0.1, 2.5, float("nan"), float("inf"), [1]):
        assert problem(slider, value).startswith("must be a number from 0 to 2, got")
    assert problem(number, None) is None and problem(number, 0) is None
    assert problem(number, -1) == "must be a number of at least 0, got -1"
    assert problem(dropdown, "laptop") is None
    assert problem(dropdown, "x" * 100) == "must be one of auto, laptop, got " + repr("x" * 100)[:37] + "..."
    assert problem(checkbox, False) is None and problem(checkbox, "yes") == "must be true or false, got 'yes'"
    assert problem(text, "7") is None and problem(text, {"a": 1}) == "must be text, got {'a': 1}"
