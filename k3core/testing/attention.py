"""Conformance checks of an attention backend, for what the prompt cache asks of it: its `positional` arrays hold a
row per position consumed; a state rebuilt from its `state_arrays` goes on exactly as the original; and the arrays
`keep_at` keeps inside a pass, with its positional rows up to there, are byte for byte those of a state that
forwarded only that far (a backend whose arrays are all positional is asked nothing: its rows are the state). On
the generated `tiny` model, the backend serving every layer of its kind."""
from __future__ import annotations

import numpy as np

from ..hookspecs import hookimpl
from ..interfaces import AttentionBackend
from ..model.engine import Engine
from ..plan.engine_config import EngineConfig
from ..plugin_manager import new_plugin_manager
from . import models
from .checks import Check, CheckFailed, expect

PROMPT = (3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7)
MORE = (9, 3, 2, 3, 8)
CUTS = (1, 5, 13)  # rows of one pass of PROMPT at which keep_at keeps the state


def attention_checks(backend: AttentionBackend) -> list[Check]:
    """Every check of the attention backend instance `backend`."""
    who = f"attention backend {backend.name!r}"

    def engine() -> Engine:
        class Offer:
            @hookimpl
            def k3_attention_backends(self):
                return [backend]

        return Engine(EngineConfig(models.model("tiny"), attention={backend.kind: backend.name}),
                      pm=new_plugin_manager([Offer()]), available=1 << 40)

    def layers(e: Engine) -> list[int]:
        return [L for L in range(e.config.num_hidden_layers) if e.attention_for(L) is backend]

    def bytes_of(arrays: dict) -> dict:
        return {name: (a.shape, np.ascontiguousarray(a).tobytes()) for name, a in arrays.items()}

    def positional_rows():
        with engine() as e:
            state = e.new_state()
            e.forward(PROMPT, state)
            for L in layers(e):
                held = backend.state_arrays(state.layers[L])
                for name in backend.positional:
                    expect(name in held, f"layer {L}: positional array {name!r} is not among state_arrays")
                    expect(len(held[name]) == len(PROMPT), f"layer {L}: {name!r} holds {len(held[name])} rows after "
                           f"{len(PROMPT)} positions")

    def rebuilt_state_goes_on():
        with engine() as e:
            state, twin = e.new_state(), e.new_state()
            e.forward(PROMPT, state)
            e.forward(PROMPT, twin)
            for L in layers(e):
                twin.layers[L] = backend.state_from_arrays(e.config, L, backend.state_arrays(twin.layers[L]))
            a, b = e.forward(MORE, state), e.forward(MORE, twin)
            expect(a.tobytes() == b.tobytes(), "a state rebuilt from state_arrays gives other logits than the original")

    def kept_inside_a_pass():
        with engine() as e:
            if any(e.snapshot_names(L) for L in layers(e)) and type(backend).keep_at is AttentionBackend.keep_at:
                raise CheckFailed("it has state arrays that are not positional and no keep_at: the prompt cache "
                                  "(on by default in every command) refuses it")
            state = e.new_state()
            e.forward(PROMPT, state, keep_at=CUTS)
            for p in CUTS:
                kept = e.arrays_at(state, p)
                alone = e.new_state()
                e.forward(PROMPT[:p], alone)
                for L in layers(e):
                    want = bytes_of(backend.state_arrays(alone.layers[L]))
                    if bytes_of(kept[L]) != want:
                        raise CheckFailed(f"layer {L}: the state keep_at kept after row {p} of a pass is not the state "
                                          f"forwarding only {p} ids gives")

    return [Check(f"{who}: its positional arrays hold a row per position", positional_rows),
            Check(f"{who}: a state rebuilt from state_arrays goes on bit for bit", rebuilt_state_goes_on),
            Check(f"{who}: keep_at keeps, inside a pass, the state forwarding only that far gives", kept_inside_a_pass)]
