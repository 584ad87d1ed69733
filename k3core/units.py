"""Units, one place: bytes in GB (decimal, as disks and the C engine's figures count them) and bytes as a person
reads them."""
from __future__ import annotations

GB = 1e9


def human(n: float) -> str:
    """Bytes in decimal units that keep three significant digits (1.56 TB, 1.23 GB, 45.6 MB, 789 kB)."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= size:
            text = f"{n / size:.3g}"
            return f"{text if 'e' not in text else f'{n / size:.0f}'} {unit}"
    return f"{int(n)} B"
