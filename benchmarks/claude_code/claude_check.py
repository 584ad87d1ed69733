"""Claude Code, unchanged, against `k3 serve` on the demo model: `make claude-check` runs it (never `make test`).

The CLI is the `claude` executable inside PyPI's claude-agent-sdk wheel, installed in its own venv by the Makefile
(.venv-claude). It talks to a `k3 serve` this script starts on a free loopback port, with a prompt cache in a fresh
directory, configured the way a user does it (docs/SERVER.md, "Claude Code"):

  ANTHROPIC_BASE_URL=http://127.0.0.1:PORT ANTHROPIC_API_KEY=any ANTHROPIC_MODEL=k3 claude -p "say hi"

Steps, each timed, each checked:
 1. `claude -p "say hi"`: it completes with a reply (the first request forwards Claude Code's whole prompt).
 2. A turn whose reply is a forced tool_use the CLI executes: `x-k3-tool-choice: ListAgents`
    (ANTHROPIC_CUSTOM_HEADERS) makes the reply to the user's message a ListAgents call — the tool whose input is
    bounded (three optional strings of at most 256 characters): the demo model, trained on no tool use, would
    otherwise write a file path until max_tokens — the CLI runs it and sends its result back, and the reply to
    that ends the turn.
 3. `claude -p "say hi"` again, a new conversation: it resumes from the first one's system prompt and tools.
 4. k3 serve restarted on the same prompt-cache directory, then step 3 again: it resumes from disk.
For each step: the CLI's exit and result, seconds, and the prompt ids the server forwarded against those the
prompt cache gave (GET /health). Exits 1 unless every step holds.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from live_server import MODEL, LiveServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def claude(cli: str, url: str, home: Path, work: Path, *args: str, headers: str | None = None):
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "ANTHROPIC_BASE_URL": url,
           "ANTHROPIC_API_KEY": "k3-local", "ANTHROPIC_MODEL": "k3", "ANTHROPIC_SMALL_FAST_MODEL": "k3",
           "API_TIMEOUT_MS": "3600000", "DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
           "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"}
    if headers:
        env["ANTHROPIC_CUSTOM_HEADERS"] = headers
    started = time.perf_counter()
    run = subprocess.run([cli, *args], cwd=work, env=env, capture_output=True, text=True, timeout=3600)
    return run, time.perf_counter() - started


def step(name: str, server: LiveServer, run_cli) -> dict:
    before = server.health()
    run, seconds = run_cli()
    after = server.health()
    reused = after.get("prompt_cache_reused_tokens", 0) - before.get("prompt_cache_reused_tokens", 0)
    row = {"step": name, "exit": run.returncode, "seconds": round(seconds, 1), "reused_ids": reused,
           "stdout": run.stdout, "stderr": run.stderr[-2000:]}
    print(f"{name}: exit {run.returncode} in {seconds:.1f} s; prompt ids from the prompt cache {reused}", flush=True)
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--claude-venv", required=True, help="the venv with claude-agent-sdk installed")
    p.add_argument("--out", default=str(ROOT / "build" / "claude-check.json"), help="the transcript (JSON)")
    args = p.parse_args()
    py = Path(args.claude_venv) / "bin" / "python"
    cli = subprocess.run([str(py), "-c", "import claude_agent_sdk, pathlib; print(pathlib.Path("
                          "claude_agent_sdk.__file__).parent / '_bundled' / 'claude')"],
                         capture_output=True, text=True, check=True).stdout.strip()
    version = subprocess.run([cli, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"claude-check: {version} against k3 serve on {MODEL}", flush=True)
    rows, ok = [], True
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        home, work, cache, log = tmp / "home", tmp / "work", tmp / "prompt-cache", tmp / "serve.log"
        home.mkdir()
        work.mkdir()
        server = LiveServer(["--prompt-cache", str(cache), "--log-level", "info"], log, "claude-check")
        try:
            def hi():
                return claude(cli, server.url, home, work, "-p", "say hi", "--output-format", "json")

            rows.append(step("1. claude -p 'say hi'", server, hi))
            rows.append(step("2. forced ListAgents tool_use, executed", server, lambda: claude(
                cli, server.url, home, work, "-p", "which agents are running?", "--output-format", "stream-json",
                "--verbose", headers="x-k3-tool-choice: ListAgents")))
            rows.append(step("3. a second conversation", server, hi))
            server.stop()
            server = LiveServer(["--prompt-cache", str(cache), "--log-level", "info"], log, "claude-check")
            rows.append(step("4. after a restart", server, hi))
        finally:
            server.stop()
        serve_log = log.read_text(errors="replace")
    for row in rows:
        ok &= row["exit"] == 0
    lines = [json.loads(x) for x in rows[1]["stdout"].splitlines() if x.startswith("{")]
    blocks = [b for m in lines if m.get("type") in ("assistant", "user") for b in m["message"].get("content", [])
              if isinstance(b, dict)]
    used = any(b.get("type") == "tool_use" and b.get("name") == "ListAgents" for b in blocks)
    answered = any(b.get("type") == "tool_result" for b in blocks)
    print(f"2. the reply was a ListAgents tool_use: {used}; the CLI ran it and sent its tool_result back: {answered}")
    ok &= used and answered
    ok &= rows[2]["reused_ids"] > 1000 and rows[3]["reused_ids"] > 1000
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"cli": version, "steps": rows, "serve_log": serve_log[-20000:]}, indent=1))
    print(f"claude-check: {'every step held' if ok else 'FAILED'}; transcript in {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
