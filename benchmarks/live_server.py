"""A live `k3 serve` on the demo model, for the checks that point real clients at it (make eval-check, claude-check,
clients-check): a free loopback port, K3_PLUGINS=none, its output in a log file, ready when /health answers.

    with LiveServer(["--prompt-cache", str(cache)], log, "clients-check") as server:
        httpx.get(server.url + "/v1/models")
"""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "wizard" / "data" / "demo-model"
K3 = Path(sys.executable).parent / "k3"
START_SECONDS = 120  # to come up, at most
STOP_SECONDS = 30    # to finish after SIGTERM, before SIGKILL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """`k3 serve MODEL --port P *flags`; exits the calling check (naming `label`, quoting the log) if the server
    dies or does not answer /health within START_SECONDS. The log is appended to, so restarts keep it whole."""

    def __init__(self, flags: list[str], log: Path, label: str, k3: Path | str = K3, model: Path = MODEL):
        self.log, self.label = log, label
        self.url = f"http://127.0.0.1:{free_port()}"
        self.cmd = [str(k3), "serve", str(model), "--port", self.url.rsplit(":", 1)[1], *flags]
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(self.cmd, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, "K3_PLUGINS": "none"})
        try:
            self._wait()
        except BaseException:  # Ctrl-C while it starts, or it never came up
            self.stop()
            raise

    def _wait(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                sys.exit(f"{self.label}: k3 serve exited {self.proc.returncode}:\n{self.log.read_text()}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        sys.exit(f"{self.label}: k3 serve did not answer /health within {START_SECONDS} s:\n{self.log.read_text()}")

    def health(self) -> dict:
        return httpx.get(self.url + "/health", timeout=10).json()

    def plan(self) -> str:
        """The memory plan the server printed before its first line of serving."""
        return self.log.read_text().split("k3 serve:")[0].rstrip()

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> "LiveServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
