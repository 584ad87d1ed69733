"""A mock Hugging Face Hub on 127.0.0.1 (threaded http.server, port 0) that the real huggingface_hub client
and the wizard's downloader talk to: model info by revision (with the commit sha), the recursive tree listing
(size, git blob id, LFS sha256), and resolve/{rev}/{path} with ETag, X-Repo-Commit, Content-Length, HEAD and
Range -> 206 + Content-Range. It counts body bytes served per file and can be told to demand a token, cut or
stall a transfer mid-file, ignore Range, throttle, or list hostile names.
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".model")
PIECE = 16 << 10


def git_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class MockHub:
    def __init__(self):
        self.repos: dict[str, dict] = {}
        self.token: str | None = None             # set: every request needs "Authorization: Bearer <token>"
        self.token_for_files_only = False         # ... except the API (listing open, files gated)
        self.served: Counter = Counter()          # file path -> body bytes sent
        self.requests: list[tuple] = []           # (method, url path, Range header, Authorization present)
        self.auth_seen: list[str | None] = []     # Authorization headers received (to check the token was sent)
        self.cut: dict[str, int] = {}             # path -> cut the next GET after this many body bytes (one-shot)
        self.stall: dict[str, tuple] = {}         # path -> (after bytes, seconds) pause the next GET (one-shot)
        self.throttle: float | None = None        # body bytes/s
        self.ignore_range = False
        self.extra_listing: list[dict] = []       # added to every tree listing as is
        self.listing_sizes: dict[str, int] = {}   # sizes the listing claims instead of the real ones
        self.lock = threading.Lock()
        self.httpd = None

    def add_repo(self, repo: str, files: dict[str, bytes], sha: str | None = None) -> str:
        sha = sha or hashlib.sha1(repo.encode() + "".join(sorted(files)).encode()).hexdigest()
        self.repos[repo] = {"refs": {"main": sha}, "commits": {sha: dict(files)}}
        return sha

    def move_main(self, repo: str, files: dict[str, bytes]) -> str:
        """A new commit on main (the old one stays reachable by its sha)."""
        sha = hashlib.sha1(repr(time.time()).encode()).hexdigest()
        self.repos[repo]["commits"][sha] = dict(files)
        self.repos[repo]["refs"]["main"] = sha
        return sha

    def start(self) -> str:
        self.httpd = _Server(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.hub = self
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def commit(self, repo: str, rev: str) -> str | None:
        r = self.repos[repo]
        return r["refs"].get(rev) or (rev if rev in r["commits"] else None)

    def entry(self, path: str, data: bytes) -> dict:
        size = self.listing_sizes.get(path, len(data))
        e = {"type": "file", "oid": git_oid(data), "size": size, "path": path}
        if path.endswith(LFS_SUFFIXES):
            e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": size, "pointerSize": 134}
        return e


class _Server(ThreadingHTTPServer):
    def handle_error(self, request, client_address):   # cut connections are the point: no tracebacks
        pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):   # quiet
        pass

    @property
    def hub(self) -> MockHub:
        return self.server.hub

    def do_HEAD(self):
        self._route(head=True)

    def do_GET(self):
        self._route(head=False)

    def _json(self, status: int, obj, headers=()) -> None:
        body = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def _route(self, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        auth = self.headers.get("Authorization")
        with self.hub.lock:
            self.hub.requests.append((self.command, path, self.headers.get("Range"), auth is not None))
            self.hub.auth_seen.append(auth)
        gated = self.hub.token and not (self.hub.token_for_files_only and path.startswith("/api/"))
        if gated and auth != f"Bearer {self.hub.token}":
            msg = "Invalid credentials in Authorization header" if auth else "Access to this model is restricted."
            return self._json(401, {"error": msg}, [("X-Error-Message", msg)])
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
            return self._info(m.group(1), m.group(2) or "main")
        if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(/.*)?", path):
            return self._tree(m.group(1), m.group(2))
        if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
            return self._resolve(m.group(1), m.group(2), m.group(3), head)
        self._json(404, {"error": "not found"})

    def _commit(self, repo: str, rev: str):
        if repo not in self.hub.repos:
            self._json(404, {"error": "Repository not found"}, [("X-Error-Code", "RepoNotFound")])
            return None
        sha = self.hub.commit(repo, rev)
        if sha is None:
            self._json(404, {"error": "Invalid rev id"}, [("X-Error-Code", "RevisionNotFound")])
        return sha

    def _info(self, repo: str, rev: str) -> None:
        if sha := self._commit(repo, rev):
            files = self.hub.repos[repo]["commits"][sha]
            self._json(200, {"id": repo, "modelId": repo, "sha": sha, "private": False, "gated": False,
                             "siblings": [{"rfilename": p} for p in sorted(files)]})

    def _tree(self, repo: str, rev: str) -> None:
        if sha := self._commit(repo, rev):
            files = self.hub.repos[repo]["commits"][sha]
            self._json(200, [self.hub.entry(p, d) for p, d in sorted(files.items())] + self.hub.extra_listing)

    def _resolve(self, repo: str, rev: str, name: str, head: bool) -> None:
        sha = self._commit(repo, rev)
        if sha is None:
            return
        data = self.hub.repos[repo]["commits"][sha].get(name)
        if data is None:
            return self._json(404, {"error": "Entry not found"}, [("X-Error-Code", "EntryNotFound")])
        entry, size = self.hub.entry(name, data), len(data)
        start, end, status = 0, size - 1, 200
        rng = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if rng and not self.hub.ignore_range:
            start, end, status = int(rng.group(1)), min(int(rng.group(2) or size - 1), size - 1), 206
            if start >= size:
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        self.send_response(status)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(end - start + 1))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", '"%s"' % (entry.get("lfs", {}).get("oid") or entry["oid"]))
        self.send_header("X-Repo-Commit", sha)
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        self.end_headers()
        if not head:
            self._send_body(name, memoryview(data)[start:end + 1])

    def _send_body(self, name: str, body: memoryview) -> None:
        hub = self.hub
        with hub.lock:   # a fault hits the next transfer long enough to reach it (not a header read)
            cut = hub.cut.pop(name) if hub.cut.get(name, len(body)) < len(body) else None
            stall = hub.stall.pop(name) if hub.stall.get(name, (len(body),))[0] < len(body) else None
        sent = 0
        try:
            while sent < len(body):
                n = min(PIECE, len(body) - sent)
                if cut is not None and sent + n > cut:
                    n = max(0, cut - sent)
                if stall is not None and sent + n > stall[0]:
                    n = max(0, stall[0] - sent)
                if n:
                    self.wfile.write(body[sent:sent + n])
                    self.wfile.flush()
                    with hub.lock:
                        hub.served[name] += n
                    sent += n
                if cut is not None and sent >= cut:
                    self.close_connection = True
                    self.connection.shutdown(2)      # mid-body: the client sees the connection drop
                    return
                if stall is not None and sent >= stall[0]:
                    time.sleep(stall[1])
                    stall = None
                if hub.throttle:
                    time.sleep(n / hub.throttle)
        except (BrokenPipeError, ConnectionResetError, OSError):
            self.close_connection = True
