"""k3's stores on disk: expert reads and the caching store plugins build on (expert_io.py, caching_store.py),
the packed-trunk format, its lossless codec, reader and packer (trunk.py, codec.py, trunk_reader.py,
pack.py), the draft trunk (draft_trunk.py, draft_pack.py).

May import: k3core.errors, k3core.interfaces, k3core.units, k3core.files, k3core.format, k3core._native
(the codec's checksum and plane join). Nothing here computes with the weights.
"""
