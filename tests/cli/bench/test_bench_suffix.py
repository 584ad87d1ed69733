"""benchmarks/suffix_bench.py (`make bench-suffix`) on a three-conversation JSONL with a small --draft-memory (the demo model's tokenizer and
decode pass): the JSON document's fields, counts that add up, and the memory pass filled past its capacity.
No timing assertions."""
import json
import subprocess
import sys
from pathlib import Path

from k3core.plugins.suffix import BYTES_PER_ID

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "suffix_bench.py"


def bench(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)

CONVERSATIONS = [
    {"kind": "rewrite", "messages": [
        {"role": "user", "content": "Rename total to amount:\n\ndef total(xs):\n    return sum(xs)\n"},
        {"role": "assistant", "content": "def amount(xs):\n    return sum(xs)\n"},
        {"role": "user", "content": "Now add a docstring."},
        {"role": "assistant", "content": 'def amount(xs):\n    """The sum."""\n    return sum(xs)\n'}]},
    {"kind": "quote", "messages": [
        {"role": "user", "content": "Quote the sentences with 'sum': The sum is kept. Nothing else is."},
        {"role": "assistant", "content": "The sum is kept."}]},
    {"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"}]},
]


def test_bench_suffix_json_reports_build_proposals_and_memory(tmp_path):
    path = tmp_path / "three.jsonl"
    path.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    done = bench("--transcripts", str(path), "--draft-memory", "0.0001", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["conversations"], doc["turns"]) == (3, 4) and doc["capacity_ids"] == 100_000 // BYTES_PER_ID
    b, p, m = doc["build"], doc["proposals"], doc["memory"]
    assert b["ids"] > 0 and b["calls"] >= 3 * doc["turns"] and b["seconds"] > 0 and b["ms_per_100_ids"] > 0
    assert b["evictions"] >= 1 and 0 < b["held"] <= doc["capacity_ids"] and b["states"] > b["held"]
    assert p["k"] == 8 and p["calls"] >= 1 and 0 < p["median_ms"] <= p["p99_ms"] <= p["max_ms"]
    assert p["forward_passes"] == 200 and p["forward_ms"] > 0 and p["vs_forward"] > 0
    assert p["walk"]["turns"] == doc["turns"] and p["walk"]["passes"] <= p["walk"]["ids"]
    assert m["planned_bytes"] >= 0 and m["planned_bytes"] == doc["capacity_ids"] * BYTES_PER_ID
    assert m["transcripts_times"] * b["ids"] >= 2 * doc["capacity_ids"]  # filled past its capacity
    assert 0 < m["held"] <= doc["capacity_ids"] and m["peak_rss_bytes"] >= m["rss_before_bytes"] > 0
    assert m["traced_held"] >= doc["capacity_ids"] and m["traced_bytes_per_id"] > 0
    assert isinstance(m["within_plan"], bool) and isinstance(m["over_bytes_per_id"], bool)
    assert {"cpu", "cores"} <= set(doc["machine"]) and doc["date"]


def test_bench_suffix_refuses_negative_memory():
    done = bench("--draft-memory", "-1")
    assert done.returncode == 2 and "--draft-memory" in done.stderr
