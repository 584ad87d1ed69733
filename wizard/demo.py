"""The demo model shipped with k3 (wizard/data/demo-model): its files, sizes and sha256, from its SHA256SUMS."""
from __future__ import annotations

from k3core import K3Error
from k3core.format.notes import demo_model_dir

DEMO_MODEL = demo_model_dir()
DEMO_SUMS = "SHA256SUMS"


def demo_files() -> dict[str, tuple[int, str]]:
    """{file name: (size, sha256)} of the shipped demo model, from its SHA256SUMS."""
    sums = DEMO_MODEL / DEMO_SUMS
    try:
        lines = sums.read_text().splitlines()
    except OSError as exc:
        raise K3Error(f"{sums}: the demo model is missing from this installation ({exc.strerror}); reinstall k3") \
            from None
    out = {}
    for line in lines:
        digest, _, name = line.partition("  ")
        if len(digest) != 64 or not name or "/" in name:
            raise K3Error(f"{sums}: not a sha256sum line: {line!r}")
        out[name] = ((DEMO_MODEL / name).stat().st_size if (DEMO_MODEL / name).exists() else 0, digest)
    return out


def demo_bytes() -> int:
    return sum(size for size, _ in demo_files().values())
