"""Files `k3 setup` takes from elsewhere than the Hub: the demo model (the trained checkpoint shipped in
wizard/data/demo-model, copied into the destination with the sha256 of its SHA256SUMS recorded, then
verified like any download), model.safetensors.index.json without the vision shards, and the sha256 of a
local checkpoint's files (recorded for `k3 verify`).
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from k3core.errors import K3Error, UsageError
from k3core.files.limits import INDEX_FILE_BYTES, read_json_limited
from k3core.format.notes import DEMO_MARKER, TEST_MODEL_MARKER
from k3core.report.meters import ProgressMeter

from .demo import DEMO_MODEL, demo_files
from .plan import HUB_INDEX, INDEX, record
from .progress import human
from .state import DONE, PARTIAL_DIR, VERIFIED, SetupState
from .verify import hash_file, table_problems


def derive_index(dest: Path, st: SetupState) -> None:
    """Without --vision, write the index without the vision shards (k3core opens every shard an index names);
    the Hub's own index stays beside it as model.safetensors.index.hub.json."""
    rec = st.files.get(INDEX)
    if rec is None or rec["kind"] != "derived" or rec["status"] in (DONE, VERIFIED):
        return
    index = read_json_limited(dest / HUB_INDEX, INDEX_FILE_BYTES, "a shard index")
    left_out = set(st.facts["vision_shards"])
    index["weight_map"] = {k: v for k, v in index.get("weight_map", {}).items() if v not in left_out}
    data = (json.dumps(index, indent=2) + "\n").encode()
    tmp = dest / PARTIAL_DIR / INDEX
    tmp.parent.mkdir(exist_ok=True)
    tmp.write_bytes(data)
    os.replace(tmp, dest / INDEX)
    st.update_file(INDEX, size=len(data), sha256=hashlib.sha256(data).hexdigest(), status=DONE, bytes=len(data))


def install_demo(dest: Path, keep: Path, st: SetupState, stream=None) -> str:
    """Copy the shipped demo model into `dest`, file by file through the partial directory, each file's sha256
    checked against SHA256SUMS on the way in (and again by the verify step). An older demo or test model in
    `dest` is replaced; anything else there is refused untouched."""
    here = [p for p in dest.iterdir() if not p.name.startswith(".k3-") and p != keep]
    if here and not ((dest / TEST_MODEL_MARKER).exists() or (dest / DEMO_MARKER).exists()):
        raise UsageError(f"{dest} already holds files that are not a k3 demo or test model; give the demo an empty "
                         "--dest")
    wanted = demo_files()
    staging = dest / PARTIAL_DIR
    staging.mkdir(exist_ok=True)
    meter = ProgressMeter("copied", sum(s for s, _ in wanted.values()), len(wanted), stream=stream)
    try:
        for name, (size, digest) in sorted(wanted.items()):
            meter.start(name, size)
            part = staging / name
            shutil.copyfile(DEMO_MODEL / name, part)
            got = hash_file(part, "sha256", size, lambda n: meter.advance(name, n))[0].hexdigest()
            if got != digest:
                part.unlink()
                raise K3Error(f"{DEMO_MODEL / name}: sha256 {got[:16]}… is not the {digest[:16]}… of its SHA256SUMS: "
                              "this installation's demo model is damaged; reinstall k3")
            meter.finish(name)
    finally:
        meter.close()
    for p in here:  # an older demo or test model (e.g. the random one of an earlier `make demo`)
        if p.is_file() and p.name not in wanted:
            p.unlink()
    files = {}
    for name, (size, digest) in sorted(wanted.items()):
        os.replace(staging / name, dest / name)
        files[name] = dict(record(None, size, digest, kind="weights" if name.endswith(".safetensors") else "meta",
                                  origin="demo"), status=DONE, bytes=size)
    st.set_files(files)
    return f"{len(files)} files, {human(sum(r['size'] for r in files.values()))}, each sha256 as shipped"


def measure_local(dest: Path, st: SetupState) -> str:
    """A checkpoint k3 setup did not download: sizes against the published table where its shard names are
    the released ones, then each file's sha256 recorded so `k3 verify` can tell later damage."""
    files, official = st.files, st.facts.get("official")
    if official and (bad := table_problems({k: r["size"] for k, r in files.items()}, vision=False)):
        raise K3Error(f"{dest}: files differ from the published shard sizes: "
                      + "; ".join(f"{k}: {v}" for k, v in bad.items()))
    for name, r in files.items():
        digest = hash_file(dest / name, "sha256", r["size"])[0].hexdigest()
        st.update_file(name, sha256=digest, origin="measured", status=VERIFIED)
    return (f"{len(files)} files" + (", sizes match the published table" if official else "")
            + "; no Hub record to compare with: sha256 of each recorded for `k3 verify`")
