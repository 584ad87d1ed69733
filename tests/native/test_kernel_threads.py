"""Per-family thread caps (Kernels.set_family_threads, EngineConfig.kernel_threads, --kernel-threads) let fewer threads
take the same whole rows, in chunks the threads take in turn: a kernel of each family, its family capped at 1, 2 and 3
of 4 threads, gives its 1-thread bytes on every native backend, and an engine with capped families generates the
default config's ids and logits. The caps are reported as set, and a wrong family or count is refused naming the valid
ones."""
import os

import numpy as np
import pytest

from k3core import EngineConfig, _native, greedy_ids, open_engine
from k3core.errors import UsageError
from k3core.cli.main import build_parser, main
from k3core.cli.options import engine_config_from_args
from k3core.interfaces import KERNEL_FAMILIES, Param
from k3core.plugins.native_kernels import NativeKernels
from k3core.plugins.reference_kernels import ReferenceKernels
from k3core.testing.kernel_cases import activations, bf16_weights, expert_case, mxfp4_weights, rng, same

BACKENDS = _native.available_backends()
THREADS, CAPS = 4, (1, 2, 3)


def kernels(name, threads):
    k = NativeKernels(name)
    k.set_threads(threads)
    return k


def family_calls():
    """family -> a call of one of its kernels whose rows 4 threads take in uneven chunks (509 rows in 16, 13 heads).
    The kernels of `other` run on the calling thread: its cap must change nothing."""
    r = rng(21)
    w, x = Param(bf16_weights(r, 509, 256), "BF16"), activations(r, (64, 256))
    packed, scale = mxfp4_weights(r, 509, 256)
    q, keys, values = activations(r, (13, 64)), activations(r, (512, 64)), activations(r, (512, 64))
    return {"dense": lambda k: k.linear(w, x),
            "experts": lambda k: k.mxfp4_linear(packed, scale, x),
            "attention": lambda k: k.mqa_attention(q, keys, values, 0.125),
            "other": lambda k: k.rmsnorm(x, x[0], 1e-5)}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("family", KERNEL_FAMILIES)
def test_a_capped_family_gives_its_one_thread_bytes(backend, family):
    call = family_calls()[family]
    want = call(kernels(backend, 1))
    k = kernels(backend, THREADS)
    # Every result stays alive: a freed one's buffer, handed to the next call, would already hold the right bytes
    # where a part skipped its rows.
    got = []
    for cap in CAPS:
        k.set_family_threads(family, cap)
        got.append(call(k))
        assert same(got[-1], want), (backend, family, cap)



@pytest.mark.parametrize("backend", BACKENDS)
def test_an_expert_of_many_tokens_gives_its_one_thread_bytes_at_every_thread_count(backend):
    """The expert kernel splits its three products and the SiTU-GLU between them by rows and tokens: 40 tokens of an
    expert with 64 intermediate columns take 16 chunks of the GLU on 4 threads."""
    e, _ = expert_case(rng(22))
    z = activations(rng(23), (40, 96)) * 4
    want = kernels(backend, 1).expert(e, z, 4.0, 25.0)
    for threads in (2, 3, 4):
        assert same(kernels(backend, threads).expert(e, z, 4.0, 25.0), want), (backend, threads)

def test_family_threads_reports_each_cap_and_an_unknown_family_is_refused_naming_the_valid_ones():
    k = kernels("scalar", THREADS)
    assert k.k.family_threads() == dict.fromkeys(KERNEL_FAMILIES, 0)  # the C++ families are KERNEL_FAMILIES, in order
    assert tuple(k.k.family_threads()) == KERNEL_FAMILIES
    k.set_family_threads("attention", 1)
    k.set_family_threads("experts", 3)
    assert k.k.family_threads() == {"dense": 0, "experts": 3, "attention": 1, "other": 0}
    k.set_family_threads("experts", 0)
    assert k.k.family_threads() == {"dense": 0, "experts": 0, "attention": 1, "other": 0}
    with pytest.raises(ValueError, match="no kernel family 'expert'; the families are dense, experts, attention, "
                                         "other"):
        k.set_family_threads("expert", 2)
    ReferenceKernels().set_family_threads("dense", 1)  # a backend without threads ignores it, as set_threads


def test_engine_config_refuses_a_bad_family_or_count_naming_kernel_threads(tiny_model):
    for bad in ({"attn": 1}, {"dense": 0}, {"experts": 1025}, {"other": True}, {"dense": 1.0}, [("dense", 1)]):
        with pytest.raises(UsageError, match=r"kernel_threads must be a mapping of kernel family \(dense, experts, "
                                             r"attention, other\) to an integer in 1\.\.1024, got "):
            EngineConfig(tiny_model, kernel_threads=bad)
    config = EngineConfig(tiny_model, kernel_threads={"attention": 1})
    assert config.as_dict()["kernel_threads"] == {"attention": 1}
    with pytest.raises(TypeError):
        config.kernel_threads["dense"] = 2  # frozen, as attention is


def test_the_cli_takes_kernel_threads_and_refuses_a_bad_pair_with_exit_2(capsys, tiny_model, tmp_path, monkeypatch):
    args = build_parser().parse_args(["run", str(tiny_model), "--kernel-threads", "attention=1",
                                      "--kernel-threads", "experts=2"])
    assert dict(engine_config_from_args(args).kernel_threads) == {"attention": 1, "experts": 2}
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    usage = ("k3: error: --kernel-threads takes FAMILY=N, FAMILY one of dense, experts, attention, other "
             "(e.g. attention=1), got ")
    for pair, error in (("foo=2", usage + "'foo=2'"), ("dense=x", usage + "'dense=x'"), ("dense", usage + "'dense'"),
                        ("dense=3", "k3: error: --kernel-threads dense=3: this process may use 2 CPUs; give "
                                    "dense=1..2"),
                        ("dense=0", "--kernel-threads must be a mapping of kernel family (dense, experts, attention, "
                                    "other) to an integer in 1..1024, got {'dense': 0}")):
        logits = tmp_path / "logits"
        code = main(["run", str(tiny_model), "--ids", "1", "--kernel-threads", pair, "--dump-logits", str(logits)])
        out, err = capsys.readouterr()
        assert (code, out) == (2, "") and error in err and "Traceback" not in err, (pair, err)
        assert not logits.exists()


def test_an_engine_with_capped_families_generates_the_default_ids_and_logits(small_model):
    prompt = [5, 17, 200, 33, 91, 128, 7, 250]
    runs = []
    # dense=1 makes the head's product, which 2 threads split on this model, one part
    capped = {"attention": 1, "experts": 2, "dense": 1}
    for config in (EngineConfig(small_model), EngineConfig(small_model, threads=2, kernel_threads=capped)):
        with open_engine(config) as e:
            assert e.kernels.k.family_threads() == {**dict.fromkeys(KERNEL_FAMILIES, 0), **config.kernel_threads}
            ids, logits = greedy_ids(e, prompt, 6)
            runs.append((ids, np.ascontiguousarray(logits).view(np.uint32).tobytes()))
    assert runs[0] == runs[1]
