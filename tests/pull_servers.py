"""Real HTTP servers on 127.0.0.1 for the pull tests: a registry, blob storage, a daemon, a Hugging Face hub.

Each is a stdlib ThreadingHTTPServer in a thread, on a port the OS picks. Knobs on the server
object change its behaviour (drop the connection, corrupt a blob, go slow) and it records what
it was asked, so tests assert on real requests.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

_RANGE = re.compile(r"bytes=(\d+)-$")


@dataclass
class Behaviour:
    drop_after: int | None = None  # close the connection once the blob reaches this offset...
    drops: int = 0  # ...this many times (then serve normally); -1: always
    drop_digest: str | None = None  # ...for this blob only
    drop_each: bool = False  # drop_after counts from where each response starts: every try makes progress
    corrupt: set[str] = field(default_factory=set)  # digests served with one byte flipped
    delay: float = 0.0  # seconds per 16 KiB piece (the slow server)
    ignore_range: bool = False
    redirect: str | None = None  # blob requests answered with a 307 to this base URL
    manifests: dict[str, bytes] = field(default_factory=dict)  # "<ns>/<model>/<tag>" -> served instead
    busy: list[int] = field(default_factory=list)  # the next blob GETs answer these statuses (429, 503), in turn


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        pass  # clients that hang up (as pulls do on errors) are part of the tests


class TestServer:
    """Base: start/stop, request log, and a blob sender that speaks Range and can misbehave."""

    __test__ = False  # not a pytest class

    def __init__(self):
        self.behaviour = Behaviour()
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self.inflight = 0
        self.max_inflight = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_GET(self):
                outer._record(self, "GET")
                outer.handle(self, "GET")

            def do_HEAD(self):
                outer._record(self, "HEAD")
                outer.handle(self, "HEAD")

            def do_POST(self):
                outer._record(self, "POST")
                outer.handle(self, "POST")

            def do_DELETE(self):
                outer._record(self, "DELETE")
                outer.handle(self, "DELETE")

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        # serve_forever looks for shutdown() every poll_interval (0.5 s by default): each test would wait for it
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def idle_within(self, seconds: float) -> bool:
        """Whether every blob download has ended, or ends within `seconds`."""
        deadline = time.monotonic() + seconds
        while self.inflight and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.inflight == 0

    def _record(self, handler, method):
        with self._lock:
            self.requests.append((method, handler.path, handler.headers.get("Range")))

    def handle(self, handler, method):  # pragma: no cover - overridden
        raise NotImplementedError

    def blob_gets(self, digest: str) -> list[str | None]:
        """The Range header of every GET of `digest` (None: the whole blob)."""
        return [rng for method, path, rng in self.requests if method == "GET" and path.endswith(digest)]

    # -- helpers for handlers --
    @staticmethod
    def send_json(handler, status: int, doc, headers: dict | None = None) -> None:
        body = json.dumps(doc).encode()
        handler.send_response(status)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        handler.wfile.write(body)

    def send_blob(self, handler, method: str, data: bytes, digest: str, headers: dict | None = None) -> None:
        b = self.behaviour
        if digest in b.corrupt:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        start = 0
        match = _RANGE.match(handler.headers.get("Range") or "")
        if match and not b.ignore_range:
            start = int(match.group(1))
            if start >= len(data):
                handler.send_response(416)
                handler.send_header("Content-Length", "0")
                handler.end_headers()
                return
            handler.send_response(206)
            handler.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            handler.send_response(200)
        handler.send_header("Content-Length", str(len(data) - start))
        handler.send_header("Accept-Ranges", "bytes")
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        if method == "HEAD":
            return
        with self._lock:
            self.inflight += 1
            self.max_inflight = max(self.max_inflight, self.inflight)
            drop = b.drop_after is not None and b.drops != 0 and digest == b.drop_digest
            if drop and b.drops > 0:
                b.drops -= 1
        try:
            # a drop at or past the offset: no bytes; with drop_each, drop_after more bytes than the try began at
            end = (
                (min(start + b.drop_after, len(data)) if b.drop_each else max(b.drop_after, start))
                if drop
                else len(data)
            )
            for offset in range(start, end, 16 << 10):
                handler.wfile.write(data[offset : min(offset + (16 << 10), end)])
                if b.delay:
                    handler.wfile.flush()
                    time.sleep(b.delay)
            if drop:
                handler.wfile.flush()
                handler.close_connection = True
                handler.connection.shutdown(2)  # mid-body: the client sees a dropped connection
        except (BrokenPipeError, ConnectionResetError, OSError):
            handler.close_connection = True
        finally:
            with self._lock:
                self.inflight -= 1


class BlobStorage(TestServer):
    """A CDN stand-in: serves `/<digest>` for whatever blobs it is given."""

    def __init__(self, blobs: dict[str, bytes]):
        self.blobs = blobs
        super().__init__()

    def handle(self, handler, method):
        digest = handler.path.rsplit("/", 1)[-1]
        if digest not in self.blobs:
            return self.send_json(handler, 404, {"errors": [{"code": "BLOB_UNKNOWN"}]})
        self.send_blob(handler, method, self.blobs[digest], digest)


class Registry(TestServer):
    """Ollama's registry API over a source store (`manifests/registry.ollama.ai/...` and `blobs/`)."""

    def __init__(self, source: Path):
        self.source = source
        super().__init__()

    def blob(self, digest: str) -> bytes:
        return (self.source / "blobs" / digest.replace(":", "-")).read_bytes()

    def manifest(self, name: str) -> bytes:
        ns, model, tag = name.split("/")
        return (self.source / "manifests" / "registry.ollama.ai" / ns / model / tag).read_bytes()

    def handle(self, handler, method):
        path = handler.path.split("?", 1)[0]
        m = re.fullmatch(r"/v2/([^/]+)/([^/]+)/manifests/([^/]+)", path)
        if m:
            key = "/".join(m.groups())
            if key in self.behaviour.manifests:
                body = self.behaviour.manifests[key]
            else:
                try:
                    body = self.manifest(key)
                except FileNotFoundError:
                    return self.send_json(handler, 404, {"errors": [{"code": "MANIFEST_UNKNOWN"}]})
            handler.send_response(200)
            handler.send_header("Content-Type", handler.headers.get("Accept") or "application/json")
            handler.send_header("Content-Length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return
        m = re.fullmatch(r"/v2/[^/]+/[^/]+/blobs/(sha256:[0-9a-f]{64})", path)
        if not m:
            return self.send_json(handler, 404, {"errors": [{"code": "NAME_UNKNOWN"}]})
        digest = m.group(1)
        if self.behaviour.busy and method == "GET":
            status = self.behaviour.busy.pop(0)
            return self.send_json(
                handler, status, {"errors": [{"code": "TOOMANYREQUESTS", "message": "slow down"}]}, {"Retry-After": "0"}
            )
        if self.behaviour.redirect:
            handler.send_response(307)
            handler.send_header("Location", f"{self.behaviour.redirect}/{digest}")
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        try:
            data = self.blob(digest)
        except FileNotFoundError:
            return self.send_json(handler, 404, {"errors": [{"code": "BLOB_UNKNOWN"}]})
        self.send_blob(handler, method, data, digest)


class Daemon(TestServer):
    """Ollama's `/api/pull` NDJSON stream, scripted: `lines` are sent as they are."""

    def __init__(self, lines: list[dict], status: int = 200):
        self.lines = lines
        self.status = status
        self.bodies: list[dict] = []
        super().__init__()

    def handle(self, handler, method):
        if handler.path == "/api/tags":
            return self.send_json(handler, 200, {"models": []})
        if handler.path != "/api/pull" or method != "POST":
            return self.send_json(handler, 404, {"error": "not found"})
        length = int(handler.headers.get("Content-Length") or 0)
        self.bodies.append(json.loads(handler.rfile.read(length) or b"{}"))
        if self.status != 200:
            return self.send_json(handler, self.status, self.lines[0])
        body = b"".join(json.dumps(line).encode() + b"\n" for line in self.lines)
        handler.send_response(200)
        handler.send_header("Content-Type", "application/x-ndjson")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


class HubEndpoint(TestServer):
    """What huggingface-hub asks a Hub for: `/api/models/<repo>` (with file sizes and LFS sha256s)
    and `/<repo>/resolve/<revision>/<file>` (HEAD metadata headers, GET with Range)."""

    COMMIT = "0123456789abcdef0123456789abcdef01234567"

    def __init__(self, repos: dict[str, dict[str, bytes]], lfs_min: int = 1024):
        self.repos = repos
        self.lfs_min = lfs_min  # files this big are LFS files (sha256 known up front), as on the Hub
        super().__init__()

    def handle(self, handler, method):
        path = handler.path.split("?", 1)[0]
        m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?", path)
        if m:
            files = self.repos.get(m.group(1))
            if files is None:
                return self.send_json(handler, 404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            return self.send_json(handler, 200, self._info(m.group(1), files))
        m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
        if m and m.group(1) in self.repos and m.group(3) in self.repos[m.group(1)]:
            data = self.repos[m.group(1)][m.group(3)]
            sha = hashlib.sha256(data).hexdigest()
            headers = {"X-Repo-Commit": self.COMMIT, "ETag": f'"{sha}"', "X-Linked-Size": str(len(data))}
            return self.send_blob(handler, method, data, m.group(3), headers)
        self.send_json(handler, 404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})

    def _info(self, repo: str, files: dict[str, bytes]) -> dict:
        siblings = []
        for name, data in files.items():
            sibling = {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
            if len(data) >= self.lfs_min:
                sha = hashlib.sha256(data).hexdigest()
                sibling["lfs"] = {"size": len(data), "sha256": sha, "pointerSize": 134}
            siblings.append(sibling)
        return {"id": repo, "modelId": repo, "sha": self.COMMIT, "private": False, "siblings": siblings}


def snapshot(root: Path) -> dict[str, str]:
    """Every file under `root` with its sha256: to prove a failed pull changed nothing."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def closed_port() -> int:
    """A port nothing listens on (bound, then released)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def registry_alone(source: Path, monkeypatch):
    """A Registry over `source`, with OLLAMA_HOST on a closed port: no daemon answers, pulls go to it."""
    server = Registry(source)
    monkeypatch.setenv("OLLAMA_HOST", f"http://127.0.0.1:{closed_port()}")
    try:
        yield server
    finally:
        server.close()
