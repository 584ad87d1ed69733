"""The conformance kit: pytest-ready checks a plugin author runs against their own class, the same
ones `k3 plugins --check` runs on every installed plugin and `make test` runs on the built-ins.

    import pytest
    from k3core.testing import expert_store_checks

    @pytest.mark.parametrize("check", expert_store_checks(MyStore), ids=str)
    def test_my_store_conforms(check):
        check()

- `expert_store_checks(cls, options=None)`: own bytes for every request pattern (a stale slot
  fails), a short read raised and not served later, capacity, plan rows, counters and cache
  policy (its hits and evictions), ids and logit bytes identical to the built-in `lru` store at
  several budgets;
- `kernel_backend_checks(backend)`: the scalar backend's bits on the kernel table at several
  thread counts, batch rows equal single rows, identical ids and logits;
- `trunk_placer_checks(cls, options=None)`: the checkpoint's own bytes for every tensor handed out,
  plan rows and counters, identical ids and logits to the `resident` placer at several budgets;
- `draft_source_checks(cls)`: a DraftSource subclass whose proposals are at most k token ids, and
  speculative decoding with the source gives the serial ids, logit bytes and decode state (greedy,
  seeded sampling, fixed K, auto);
- `attention_backend_checks(backend)`: what the prompt cache asks of an attention backend instance — its
  positional arrays hold a row per position, a state rebuilt from state_arrays goes on bit for bit, and the
  state keep_at keeps inside a pass is the state forwarding only that far gives.

Each check is a `Check` (a name and a callable raising CheckFailed); `run_checks` runs a list into
results without raising. Checks run on generated test checkpoints written once per process (set
K3_TESTING_DIR to keep them between runs).
"""
from .attention import attention_checks as attention_backend_checks
from .checks import Check, CheckFailed, Result, run_checks
from .drafts import draft_checks as draft_source_checks
from .kernel_cases import KernelCase, kernel_cases
from .kernels import kernel_checks as kernel_backend_checks
from .placers import placer_checks as trunk_placer_checks
from .stores import store_checks as expert_store_checks

__all__ = ["Check", "CheckFailed", "Result", "run_checks", "expert_store_checks", "kernel_backend_checks",
           "trunk_placer_checks", "draft_source_checks", "attention_backend_checks", "KernelCase", "kernel_cases"]
