"""What the page refuses from a client, and how: every refusal is a `Refused` (a gr.Error the page shows in its
error box) whose message names the field, and one warning line in the log ("k3.ui"), never a traceback.
`check_inputs(demo)` checks each event's values against its controls before Gradio's own preprocessing (a
slider's number and range, a dropdown's choices, …), and turns whatever Gradio still refuses into the same one
line. It does not judge what the handlers do with valid values (ui/app.py, ui/guard.py refuse with `refuse`).
Checked by tests/ui/test_inputs.py and the ui rows of tests/faults/test_clients.py.
"""
from __future__ import annotations

import logging
import math

import gradio as gr

log = logging.getLogger("k3.ui")


class Refused(gr.Error):
    """Bad input from a client: shown on the page, logged in one line by `refuse`, no traceback."""

    def __init__(self, message: str):
        super().__init__(message, print_exception=False)


def refuse(message: str, event: str = "") -> Refused:
    """The error to raise for bad input, logged now as one line (the client's values are shown by repr, cut short,
    so nothing it sent can break the line)."""
    log.warning("refused a client's input%s: %s", f" to {event}" if event else "", " ".join(message.split()))
    return Refused(message)


def shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def field_name(block) -> str:
    return getattr(block, "label", None) or getattr(block, "elem_id", None) or type(block).__name__


def problem(block, value) -> str | None:
    """What is wrong with `value` for the control `block` (None: nothing this module checks)."""
    if isinstance(block, (gr.Slider, gr.Number)):
        if value is None and isinstance(block, gr.Number):
            return None
        low, high = block.minimum, block.maximum
        bounds = (f" from {low:g} to {high:g}" if low is not None and high is not None else
                  f" of at least {low:g}" if low is not None else f" of at most {high:g}" if high is not None else "")
        number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        if not number or (low is not None and value < low) or (high is not None and value > high):
            return f"must be a number{bounds}, got {shown(value)}"
    elif isinstance(block, (gr.Dropdown, gr.Radio)):
        choices = [choice for _, choice in block.choices]
        if value not in choices:
            return f"must be one of {', '.join(map(str, choices))}, got {shown(value)}"
    elif isinstance(block, gr.Checkbox):
        if not isinstance(value, bool):
            return f"must be true or false, got {shown(value)}"
    elif isinstance(block, gr.Textbox):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (str, int, float))):
            return f"must be text, got {shown(value)}"
    return None


def check_inputs(demo: gr.Blocks) -> gr.Blocks:
    """Check every event's input values of `demo` before Gradio preprocesses them (see the module's contract)."""
    preprocess_data = demo.preprocess_data

    async def checked(block_fn, inputs, state, *args, **kwargs):
        event = f"/{block_fn.api_name}" if isinstance(block_fn.api_name, str) else (block_fn.name or "")
        if len(inputs) < len(block_fn.inputs):
            raise refuse(f"{event or 'this event'} takes {len(block_fn.inputs)} input values ("
                         f"{', '.join(field_name(b) for b in block_fn.inputs)}), got {len(inputs)}", event)
        for i, block in enumerate(block_fn.inputs):
            if i in block_fn.component_prop_inputs or block.stateful:
                continue
            current = state[block._id] if state is not None and block._id in state else block  # after an update
            wrong = problem(current, inputs[i])
            if wrong:
                raise refuse(f"{field_name(current)}: {wrong}", event)
        try:
            return await preprocess_data(block_fn, inputs, state, *args, **kwargs)
        except Refused:
            raise
        except Exception as exc:  # noqa: BLE001 - Gradio refused a value: the client's fault, said in one line
            message = (exc.message if isinstance(exc, gr.Error) else str(exc)).strip() or type(exc).__name__
            raise refuse(f"{event or 'this event'}: {message.splitlines()[0]}", event) from None

    demo.preprocess_data = checked
    return demo
