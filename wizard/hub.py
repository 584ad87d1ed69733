"""The Hub side of `k3 setup`: the token, the revision resolved to a commit sha, the file listing (names
checked before anything is written), file URLs and ranged reads. Metadata and URLs come from
huggingface_hub (HF_ENDPOINT picks the server); the bulk download is wizard/download.py's own.
Never prints, logs or stores the token. Checked by tests/wizard against a mock Hub on 127.0.0.1.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import PurePosixPath

import httpx2
from huggingface_hub import HfApi, get_session, get_token, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled, RevisionNotFoundError
from huggingface_hub.utils import build_hf_headers

from k3core import K3Error, __version__
from k3core.files.limits import loads_limited

DEFAULT_ENDPOINT = "https://huggingface.co"
RESERVED_PREFIX = ".k3-"            # the wizard's own files in the destination: a listing may not name them
HEADER_LIMIT = 256 << 20            # a safetensors header larger than this is not a checkpoint


class HubError(K3Error):
    """The Hub (or a mirror) refused, is unreachable, or listed something the wizard will not write."""

    exit_code = 2


class UnreachableError(HubError):
    """No answer from the Hub at all: the network or the endpoint is down, or HF_HUB_OFFLINE is set. `reason` says
    which, in a few words (what --dry-run prints for what it could not check)."""

    def __init__(self, message: str, reason: str, offline_mode: bool = False):
        super().__init__(message)
        self.reason, self.offline_mode = reason, offline_mode


class AuthError(HubError):
    """401/403: a token is missing, wrong, or lacks access to the repository."""


class TransientError(Exception):
    """A request that may succeed when retried (connection cut, stall, 429, 5xx)."""


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None   # LFS files: the sha256 of the content
    oid: str | None      # git blob id (sha1 of "blob SIZE\0" + content): how plain files are checked


def endpoint() -> str:
    """HF_ENDPOINT, read now (huggingface_hub reads it at import), else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def check_remote_name(name: str, repo: str) -> str:
    """A listed path must be relative, without '..', '.', empty parts, backslashes or control characters,
    and must not name the wizard's own files; anything else is refused before a byte is written."""
    parts = name.split("/") if isinstance(name, str) else [""]
    if (not isinstance(name, str) or not name or "\\" in name or PurePosixPath(name).is_absolute()
            or any(p in ("", ".", "..") for p in parts) or any(ord(c) < 32 or c == "\x7f" for c in name)
            or parts[0].startswith(RESERVED_PREFIX)):
        raise HubError(f"the listing of {repo} names the file {name!r}, which is not a plain relative path inside "
                       "the destination ('..', an absolute path, a backslash or an empty part): refusing to write "
                       "anything; check HF_ENDPOINT points at a Hub you trust")
    return name


class Hub:
    """One repository on one endpoint, with the token that opens it."""

    def __init__(self, repo: str, ask_token=None):
        self.repo, self.endpoint, self.ask_token = repo, endpoint(), ask_token
        self.token = get_token()          # HF_TOKEN, else a saved `hf auth login`
        self.token_from = ("HF_TOKEN" if os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
                           else "your saved Hugging Face login" if self.token else None)
        self.api = HfApi(endpoint=self.endpoint, library_name="k3", library_version=__version__)

    # ---- auth ---------------------------------------------------------------------------------
    def headers(self, **extra) -> dict:
        return build_hf_headers(token=self.token or False, library_name="k3", library_version=__version__,
                                headers=extra or None)

    def auth_error(self, status: int) -> AuthError:
        page = f"{self.endpoint}/{self.repo}"
        if self.token_from is None:
            return AuthError(f"{self.repo}: the Hub answered {status}: this repository needs a Hugging Face access "
                             f"token. Create a read token at {self.endpoint}/settings/tokens (and accept the model's "
                             f"terms at {page} if it asks), then set HF_TOKEN in the environment and run the same "
                             "command again, or run it in a terminal without --yes to be asked for the token")
        return AuthError(f"{self.repo}: the Hub refused the token from {self.token_from} ({status}): check that it is "
                         f"valid, can read {self.repo}, and that you accepted the terms at {page}; then run the same "
                         "command again (the token itself is never shown)")

    def retry_with_new_token(self) -> bool:
        """Ask once (interactive runs only) for a token after a 401/403; True if there is a new one."""
        ask, self.ask_token = self.ask_token, None
        token = ask() if ask else None
        if token:
            self.token, self.token_from = token, "the prompt"
        return bool(token)

    def _call(self, what: str, fn):
        while True:
            try:
                return fn()
            except HfHubHTTPError as exc:
                status = exc.response.status_code if exc.response is not None else None
                if status in (401, 403):
                    if self.retry_with_new_token():
                        continue
                    raise self.auth_error(status) from None
                if isinstance(exc, RevisionNotFoundError):
                    raise HubError(f"{self.repo}: {what}: no such revision on {self.endpoint}") from None
                if status == 404:
                    raise HubError(f"{self.repo}: {what}: not found on {self.endpoint} (404): check the repository "
                                   "name (hf://OWNER/NAME[@REVISION]) and HF_ENDPOINT") from None
                raise HubError(f"{self.repo}: {what}: the Hub answered HTTP {status}; try again later") from None
            except OfflineModeIsEnabled:
                raise UnreachableError("HF_HUB_OFFLINE is set, so nothing can be downloaded: unset it, or set up "
                                       "from a local directory (--source DIR)", "HF_HUB_OFFLINE is set",
                                       offline_mode=True) from None
            except httpx2.TransportError as exc:
                reason = f"cannot reach {self.endpoint} ({type(exc).__name__}: {exc})"
                raise UnreachableError(f"{reason}; check the network, or HF_ENDPOINT if you use a mirror",
                                       reason) from None

    # ---- metadata -----------------------------------------------------------------------------
    def resolve(self, revision: str) -> str:
        """The commit sha `revision` (branch, tag or sha) points at now."""
        info = self._call(f"revision {revision!r}", lambda: self.api.model_info(
            self.repo, revision=revision, token=self.token or False))
        if not isinstance(info.sha, str) or len(info.sha) != 40:
            raise HubError(f"{self.repo}: the Hub gave no commit sha for revision {revision!r}")
        return info.sha

    def listing(self, sha: str) -> list[RemoteFile]:
        """Every file at commit `sha` with its size and LFS sha256 / git blob id; every name checked."""
        entries = self._call("file listing", lambda: list(self.api.list_repo_tree(
            self.repo, revision=sha, recursive=True, token=self.token or False)))
        files = []
        for e in entries:
            check_remote_name(e.path, self.repo)
            if hasattr(e, "size"):              # RepoFile; RepoFolder has no size
                lfs = getattr(e, "lfs", None)
                files.append(RemoteFile(e.path, int(e.size), lfs.sha256 if lfs else None, e.blob_id))
        return sorted(files, key=lambda f: f.path)

    def url(self, path: str, sha: str) -> str:
        return hf_hub_url(self.repo, path, revision=sha, endpoint=self.endpoint)

    # ---- ranged reads -------------------------------------------------------------------------
    def read_range(self, path: str, sha: str, start: int, n: int, timeout: float = 30.0) -> bytes:
        """Bytes [start, start+n) of a remote file (a 200 answer is cut to the range, never read whole)."""
        while True:
            headers = self.headers(Range=f"bytes={start}-{start + n - 1}", **{"Accept-Encoding": "identity"})
            try:
                with get_session().stream("GET", self.url(path, sha), headers=headers, timeout=timeout) as r:
                    if r.status_code in (401, 403):
                        if self.retry_with_new_token():
                            continue
                        raise self.auth_error(r.status_code)
                    if r.status_code not in (200, 206):
                        raise HubError(f"{self.repo}/{path}: the Hub answered HTTP {r.status_code} to a ranged read")
                    want, out = (start + n if r.status_code == 200 else n), bytearray()
                    for piece in r.iter_bytes():
                        out += piece
                        if len(out) >= want:
                            break
                    return bytes(out[want - n:want])
            except OfflineModeIsEnabled:
                raise UnreachableError("HF_HUB_OFFLINE is set, so nothing can be downloaded: unset it",
                                       "HF_HUB_OFFLINE is set", offline_mode=True) from None
            except httpx2.TransportError as exc:
                reason = f"reading {self.endpoint}/{self.repo}/{path} failed ({type(exc).__name__}: {exc})"
                raise UnreachableError(f"{self.repo}/{path}: reading bytes {start}+{n} failed "
                                       f"({type(exc).__name__}: {exc})", reason) from None

    def read_header(self, path: str, sha: str) -> dict:
        """A remote shard's safetensors header (two ranged reads; no tensor data)."""
        head = self.read_range(path, sha, 0, 8)
        n = int.from_bytes(head, "little") if len(head) == 8 else 0
        if not 0 < n <= HEADER_LIMIT:
            raise HubError(f"{self.repo}/{path}: not a safetensors file (header length {n})")
        try:
            header = loads_limited(self.read_range(path, sha, 8, n), f"{self.repo}/{path}: the safetensors header")
        except ValueError as exc:
            raise HubError(f"{self.repo}/{path}: the safetensors header is not JSON ({exc})") from None
        if not isinstance(header, dict):
            raise HubError(f"{self.repo}/{path}: the safetensors header is not a JSON object")
        return header

    def measure_rate(self, path: str, sha: str, size: int, nbytes: int = 8 << 20) -> float:
        """Bytes/s of one short ranged GET (used by --dry-run to estimate the download time)."""
        n = min(nbytes, size)
        t0 = time.perf_counter()
        got = len(self.read_range(path, sha, 0, n))
        return got / max(time.perf_counter() - t0, 1e-6)
