"""The benchmark scripts beside k3 (benchmarks/*.py, run by make targets, never by `make test`) still import:
a module that moved or a function that went away fails here, not when someone next runs the benchmark.
Each is loaded as a module (its `__main__` block does not run); a script shows the entry point its make target calls
(a module the scripts share, such as live_server.py, has none to show)."""
import importlib.util
import os
import platform
import shutil
import subprocess
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")))
def test_a_benchmark_script_imports_and_has_its_main(script):
    spec = importlib.util.spec_from_file_location(f"bench_{script[:-3]}", BENCHMARKS / script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if '__name__ == "__main__"' in (BENCHMARKS / script).read_text():
        assert callable(getattr(module, "main", None)), f"{script}: no main()"


def test_the_index_bench_lays_out_k3_s_tensors():
    spec = importlib.util.spec_from_file_location("bench_index", BENCHMARKS / "index_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    names = [t[0] for t in module.shard_tensors(1)]
    assert names and all(isinstance(n, str) for n in names)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64", "amd64"), reason="an x86-64 benchmark")
@pytest.mark.parametrize("flags", [["-DWIDTH=512", "-mavx512f", "-mfma"], ["-DWIDTH=256", "-mavx2", "-mfma"]])
def test_the_fma_ceiling_benchmark_still_compiles(flags):
    """`make bench-ceiling`'s C++ (benchmarks/fma_ceiling.cpp), both widths: checked, not run (it times)."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler on PATH")
    done = subprocess.run([compiler, "-fsyntax-only", "-Wall", "-Werror", "-O2", *flags,
                           str(BENCHMARKS / "fma_ceiling.cpp")], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
