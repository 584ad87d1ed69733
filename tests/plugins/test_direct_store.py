"""The `direct` expert store: the bytes it serves are the checkpoint's, expert by expert, in the
order asked; a short read ends the run as unsound instead of serving zeros."""
import shutil

import numpy as np
import pytest

from k3core.checkpoint import EXPERT_PARTS, expert_prefix, open_checkpoint
from k3core.errors import UnsoundRunError
from k3core.plugins.direct_store import DirectStore


def test_serves_each_expert_s_own_bytes_in_the_order_asked(tiny_model):
    ckpt = open_checkpoint(tiny_model)
    store = DirectStore(ckpt, ckpt.config, {})
    got = store.fetch(2, [5, 0, 7])
    assert [e.expert for e in got] == [5, 0, 7]
    for e in got:
        for part, field in zip(EXPERT_PARTS, ("w1_packed", "w1_scale", "w2_packed", "w2_scale", "w3_packed", "w3_scale")):
            assert np.array_equal(getattr(e, field), ckpt.index.read(expert_prefix(2, e.expert) + part))
    assert store.stats()["expert_requests"] == 3
    assert store.stats()["expert_bytes_read"] == 3 * sum(
        ckpt.index[expert_prefix(2, 0) + p].nbytes for p in EXPERT_PARTS)
    store.close()


def test_a_short_read_is_unsound_not_zeros(tiny_model, tmp_path):
    model = shutil.copytree(tiny_model, tmp_path / "m")
    ckpt = open_checkpoint(model)
    store = DirectStore(ckpt, ckpt.config, {})
    last = expert_prefix(3, ckpt.config.num_experts - 1) + "w3.weight_scale"
    shard = ckpt.index[last].file
    with open(shard, "r+b") as f:  # the file shrinks after the index was read
        f.truncate(ckpt.index[last].offset + 1)
    with pytest.raises(UnsoundRunError, match="short read.*unsound"):
        store.fetch(3, [ckpt.config.num_experts - 1])
    store.close()
