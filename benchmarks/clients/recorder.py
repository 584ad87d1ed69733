"""A loopback HTTP proxy in front of `k3 serve` that keeps every exchange: the clients are pointed at it, and it
passes each request and each reply (streamed ones as they arrive) through byte for byte, so that the check can read
the usage, finish_reason and text of replies a client library hides, and the body of any request k3 refused.

It changes nothing on the wire but framing: replies go out HTTP/1.0-style, ended by closing the connection; no
Accept-Encoding is forwarded, so what it keeps is plain JSON or SSE. Not a general proxy: GET and POST only.
"""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx

# not passed on: hop-by-hop headers, Accept-Encoding (see above), and the two http.server writes itself
HOP = {"host", "connection", "keep-alive", "content-length", "transfer-encoding", "accept-encoding", "server", "date"}


@dataclass
class Exchange:
    """One request and its reply, under the label the check had set when the request arrived."""
    label: str
    method: str
    path: str
    request: bytes
    status: int = 0
    reply: bytes = b""
    summary: dict = field(default_factory=dict)
    done: threading.Event = field(default_factory=threading.Event)


def loads(text: str):
    try:
        return json.loads(text)
    except ValueError:
        return None


def reply_summary(status: int, reply: bytes) -> dict:
    """completion_tokens, finish_reason and text (content, else the tool calls' arguments) of a chat completion,
    whole or streamed as SSE; a refusal's error message."""
    text = reply.decode(errors="replace")
    if status != 200:
        try:
            return {"error": json.loads(text)["error"]["message"]}
        except (ValueError, KeyError, TypeError):
            return {"error": text[:500]}
    if text.lstrip().startswith("{"):
        chunks, key = [loads(text)], "message"
    else:  # SSE; a stream cut short by a killed client may end in half a line
        chunks = [loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]
        key = "delta"
    out = {"completion_tokens": None, "finish_reason": None, "text": ""}
    for chunk in filter(None, chunks):
        out["completion_tokens"] = (chunk.get("usage") or {}).get("completion_tokens", out["completion_tokens"])
        for choice in chunk.get("choices") or []:
            out["finish_reason"] = choice.get("finish_reason") or out["finish_reason"]
            part = choice.get(key) or {}
            out["text"] += part.get("content") or ""
            out["text"] += "".join(c["function"].get("arguments") or "" for c in part.get("tool_calls") or [])
    return out


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        self.forward()

    def do_POST(self):
        self.forward()

    def log_message(self, *args):
        pass

    def forward(self) -> None:
        recorder = self.server.recorder
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        ex = Exchange(recorder.label, self.command, self.path, body)
        recorder.exchanges.append(ex)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP}
        chunks = []
        try:
            with httpx.stream(self.command, recorder.upstream + self.path, content=body, headers=headers,
                              timeout=None) as r:
                ex.status = r.status_code
                self.send_response(r.status_code)
                for k, v in r.headers.items():
                    if k.lower() not in HOP:
                        self.send_header(k, v)
                self.send_header("Connection", "close")
                self.end_headers()
                for chunk in r.iter_raw():
                    chunks.append(chunk)
                    self.wfile.write(chunk)
                    self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client left (a try past its time limit was killed): leaving closes k3's reply too
        finally:
            ex.reply = b"".join(chunks)
            ex.summary = reply_summary(ex.status, ex.reply) if ex.path.endswith("/chat/completions") else {}
            ex.done.set()


class Recorder:
    """The proxy, serving on a free loopback port from a daemon thread; `label` tags the exchanges that follow."""

    def __init__(self, upstream: str):
        self.upstream, self.exchanges, self.label = upstream, [], ""
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.recorder = self
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def labelled(self, label: str) -> list[Exchange]:
        return [ex for ex in self.exchanges if ex.label == label]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
