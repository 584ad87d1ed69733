"""Benchmark recording the tensor checksums (k3-tensor-sums.bin) as `k3 setup`'s verify step does it: the shards'
sha256 pass alone, then the same pass with every tensor's checksum fed from the bytes it reads (ShardSums), then
a pass of their own (what recording would cost if it read the shards again). The page cache is dropped before
each pass (needs root: /proc/sys/vm/drop_caches); 4 files at a time, as `k3 setup --jobs 4`.
Not a test: it prints seconds. `make bench-sums MODEL=DIR` runs it (e.g. on `k3 make-model DIR --shape wide`).
"""
import argparse
import hashlib
import io
import os
import time
from pathlib import Path

from wizard.verify import check_files, record_sums


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        while block := f.read(8 << 20):
            h.update(block)
    return h.hexdigest()


def cold() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path)
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    records = {f.name: {"size": f.stat().st_size, "sha256": sha256_of(f)} for f in sorted(args.model.glob("*.safetensors"))}
    gb = sum(r["size"] for r in records.values()) / 1e9
    for _ in range(args.rounds):
        for label, sums in (("sha256 alone", None), ("sha256 + tensor checksums, one pass", {})):
            cold()
            started = time.perf_counter()
            bad = check_files(args.model, records, 4, io.StringIO(), sums=sums)
            line = f"{label}: {time.perf_counter() - started:.2f} s for {gb:.2f} GB" + (f", BAD {bad}" if bad else "")
            if sums is not None:
                started = time.perf_counter()
                record_sums(args.model, 4, io.StringIO(), known=sums)
                line += f"; the table written in {time.perf_counter() - started:.2f} s"
            print(line)
    cold()
    started = time.perf_counter()
    record_sums(args.model, 4, io.StringIO())
    print(f"the tensor checksums in a pass of their own: {time.perf_counter() - started:.2f} s")


if __name__ == "__main__":
    main()
