"""Bytes on disk: the safetensors header index, aligned O_DIRECT reads, expert reads, the packed-trunk
format, its lossless codec, reader and packer, atomic writes, decode-state files and the saved profile.

May import: k3core.errors, k3core.interfaces, k3core.format.config / checkpoint (tensor names), k3core._native
(the codec's checksum and plane join). Nothing here computes with the weights.
"""
