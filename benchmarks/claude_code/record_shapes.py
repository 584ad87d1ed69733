"""Record the request shapes Claude Code sends, for tests/serve/test_claude_code_shapes.py: its CLI (the
`claude` executable inside PyPI's claude-agent-sdk wheel) runs against a loopback stand-in for the Messages API
that writes down every request and answers with fixed replies — a text, or a `Read` tool_use the CLI executes —
and every text in the requests is replaced by generated text of the same length, so the repository keeps the
shapes (every field and block, their order, lengths and identifiers) and none of another product's prompts.

  .venv/bin/python benchmarks/claude_code/record_shapes.py --claude .venv-claude/…/_bundled/claude \\
      --out tests/fixtures/claude_code/requests.json

Scenarios: `claude -p "say hi"` (one request); a turn whose reply is a tool_use of Read that the CLI executes
(the request with the tool_result follows); and `-p` again with another session (its billing header differs).
"""
from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

BILLING = "x-anthropic-billing-header:"
WORDS = ("kappa three engine token layer prompt state cache model reply tool call file path line read write run "
         "check value field block order text stream batch plan memory disk trunk expert route weight").split()
KEPT_HEADERS = ("anthropic-beta", "anthropic-version", "x-app", "user-agent")
IDENTIFIER = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/")


def filler(length: int, seed: int) -> str:
    """Generated text of exactly `length` characters: words, spaces, a newline every few lines' worth."""
    r, out, size = random.Random(seed), [], 0
    while size < length:
        word = r.choice(WORDS) + ("\n" if r.random() < 0.08 else " ")
        out.append(word)
        size += len(word)
    return "".join(out)[:length]


CCH = itertools.count(1)  # the billing header's per-request value, made up


def anonymised(value):
    """`value` with every text replaced: a string that is not a short identifier becomes filler of its length,
    the same filler wherever the same text was sent (so what requests share, they still share); the billing
    header keeps its form with made-up values, another in each request."""
    if isinstance(value, dict):
        return {k: anonymised(v) for k, v in value.items()}
    if isinstance(value, list):
        return [anonymised(v) for v in value]
    if not isinstance(value, str):
        return value
    if value.startswith(BILLING):
        return f"{BILLING} cc_version=0.0.0.000; cc_entrypoint=sdk-cli; cch={next(CCH):05x};"
    if len(value) <= 40 and set(value) <= IDENTIFIER:
        return value
    return filler(len(value), int.from_bytes(hashlib.sha256(value.encode()).digest()[:8], "little"))


class Recorder(BaseHTTPRequestHandler):
    requests: list = []
    tool_turn = threading.Event()  # the next reply (to a request without tool results) is a Read tool_use
    read_path = ""                 # the file that Read reads

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"null")
        self.requests.append({"path": self.path, "headers": {k: self.headers[k] for k in KEPT_HEADERS
                                                             if k in self.headers}, "body": body})
        if "count_tokens" in self.path:
            return self._json({"input_tokens": 100})
        last = body["messages"][-1]["content"]
        results = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
        if self.tool_turn.is_set() and not results:
            block = {"type": "tool_use", "id": "toolu_0001", "name": "Read",
                     "input": {"file_path": self.read_path}}
            return self._reply(block, "tool_use")
        return self._reply({"type": "text", "text": "ok"}, "end_turn")

    def _json(self, payload):
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _reply(self, block: dict, stop: str):
        """One streamed message holding `block`."""
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()

        def event(name, **data):
            self.wfile.write(f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode())

        usage = {"input_tokens": 100, "output_tokens": 0}
        event("message_start", message={"id": "msg_0001", "type": "message", "role": "assistant", "model": "k3",
                                        "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage})
        start = {**block, "input": {}} if block["type"] == "tool_use" else {**block, "text": ""}
        event("content_block_start", index=0, content_block=start)
        delta = ({"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                 if block["type"] == "tool_use" else {"type": "text_delta", "text": block["text"]})
        event("content_block_delta", index=0, delta=delta)
        event("content_block_stop", index=0)
        event("message_delta", delta={"stop_reason": stop, "stop_sequence": None}, usage={"output_tokens": 1})
        event("message_stop")


def run_cli(claude: str, url: str, home: Path, work: Path, *args: str) -> None:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "ANTHROPIC_BASE_URL": url,
           "ANTHROPIC_API_KEY": "not-a-key", "ANTHROPIC_MODEL": "k3", "ANTHROPIC_SMALL_FAST_MODEL": "k3",
           "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    subprocess.run([claude, *args], cwd=work, env=env, timeout=300, check=True, capture_output=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--claude", required=True, help="the CLI: claude_agent_sdk/_bundled/claude")
    p.add_argument("--out", required=True, help="the fixture to write")
    args = p.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    with tempfile.TemporaryDirectory() as tmp:
        home, work = Path(tmp) / "home", Path(tmp) / "work"
        home.mkdir()
        work.mkdir()
        (work / "notes.txt").write_text("a file the Read tool reads\n")
        Recorder.read_path = str(work / "notes.txt")
        scenarios = {}
        for name, args_, tool in (("say-hi", ["-p", "say hi"], False),
                                  ("tool-turn", ["-p", "read notes.txt", "--max-turns", "2"], True),
                                  ("say-hi-again", ["-p", "say hi"], False)):
            Recorder.requests.clear()
            (Recorder.tool_turn.set if tool else Recorder.tool_turn.clear)()
            run_cli(args.claude, url, home, work, *args_)
            scenarios[name] = [{**r, "body": anonymised(r["body"])} for r in Recorder.requests
                               if "count_tokens" not in r["path"]]
    server.shutdown()
    version = subprocess.run([args.claude, "--version"], capture_output=True, text=True).stdout.strip()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cli": version, "scenarios": scenarios}, indent=1) + "\n")
    print(f"{args.out}: {sum(map(len, scenarios.values()))} requests from {version}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
