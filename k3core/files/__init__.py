"""Files, bounded and safe: reading a file or a JSON document within a named limit (limits.py), replacing
k3's own files atomically and writing a user's output without replacing a device (atomic.py), the one
O_DIRECT aligned reader (aligned_io.py), and what the block devices under some files did (device.py).

May import: k3core.errors. Knows nothing of checkpoints, models or text.
"""
