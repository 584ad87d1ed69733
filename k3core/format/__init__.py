"""The checkpoint format, one room: config.json as a frozen Config (config.py), the tensor names and shapes
the config implies and the binding check (checkpoint.py), MXFP4 (mxfp4.py), the safetensors header index
and its scan (safetensors_index.py, header_scan.py), the per-tensor checksums and reading every tensor
once (tensor_sums.py, scan.py), and the marker files of the demo and test models (notes.py). docs/MODEL.md
is the format in prose.

May import: k3core.errors, k3core.interfaces, k3core.files, k3core._native (checksums).
"""
