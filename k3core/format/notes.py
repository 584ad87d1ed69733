"""What a checkpoint is when it is not the released Kimi K3: the marker files the demo model and generated
test models carry, the one line k3 prints about them, and where the demo model ships."""
from __future__ import annotations

from pathlib import Path

DEMO_MARKER = "k3-demo-model.json"        # written by demo/train.py beside the demo checkpoint
TEST_MODEL_MARKER = "k3-test-model.json"  # written by `k3 make-model` (k3core/testmodel/make.py)
DEMO_NOTE = ("the k3 demo model: a tiny model with the Kimi K3 architecture, trained to answer capitals, small sums, "
             "colours, opposites and greetings, and to write short JSON and tool calls; it is not Kimi K3")
TEST_MODEL_NOTE = "a generated test model: random weights in the real K3 format; it streams tokens, not sense"


def demo_model_dir() -> Path:
    """Where the wizard ships the trained demo model: wizard/data/demo-model beside k3core. The path is returned
    whether or not it holds a model (a checkout or package without the demo has none); callers check."""
    return Path(__file__).resolve().parents[2] / "wizard" / "data" / "demo-model"


def model_note(model_dir) -> str | None:
    """One line that says what a checkpoint is when it is not the released model (the demo, a test model)."""
    root = Path(model_dir)
    if (root / DEMO_MARKER).is_file():
        return DEMO_NOTE
    if (root / TEST_MODEL_MARKER).is_file():
        return TEST_MODEL_NOTE
    return None
