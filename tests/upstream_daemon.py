"""A stand-in Ollama daemon over real HTTP on 127.0.0.1, for `serve --upstream`: /api/tags, /api/ps,
/api/version, /api/generate (keep_alive 0 unloads), /api/delete and /api/copy (of its `tags`), /api/chat and
/v1/chat/completions streaming slowly.

Knobs are attributes (`tags`, `loaded`, `delay`, and the faults: `cut`, `trickle`, `tags_body`,
`answer_headers`); every request is recorded with its headers and body.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass

from tests.fake_ollama import ps_entry
from tests.pull_servers import TestServer


@dataclass
class Asked:
    method: str
    path: str  # with the query
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


def huge_listing(size: int) -> bytes:
    """An /api/tags answer of about `size` bytes: distinct models, as a daemon with very many would list."""
    entry = json.dumps(ps_entry("big-0000000:latest", 1, 0))
    count = size // len(entry) + 1
    return ('{"models": [' + ", ".join(entry.replace("0000000", f"{i:07d}") for i in range(count)) + "]}").encode()


class UpstreamDaemon(TestServer):
    def __init__(self, tags: list[str] | None = None, loaded: list[str] | None = None):
        self.tags = tags or []
        self.loaded = loaded or []
        self.pieces = ["Hel", "lo", " there"]
        self.delay = 0.3  # seconds between two streamed pieces
        self.unload_lag = 0.0  # seconds /api/ps still lists a model after keep_alive 0
        self.cut = False  # /api/chat answers break off halfway: the connection drops mid-body
        self.trickle = 0.0  # seconds between two bytes of the /api/tags and /api/ps answers
        self.tags_body: bytes | None = None  # /api/tags answers these bytes instead
        self.answer_headers: dict[str, str] = {}  # added to the /api/chat answers
        self.asked: list[Asked] = []
        super().__init__()

    def requests_to(self, path: str) -> list[Asked]:
        return [a for a in self.asked if a.path.split("?")[0] == path]

    def handle(self, handler, method: str) -> None:
        body = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        self.asked.append(Asked(method, handler.path, {k.lower(): v for k, v in handler.headers.items()}, body))
        path = handler.path.split("?")[0]
        try:
            doc = json.loads(body) if body else {}
        except ValueError:  # a blob's bytes
            doc = {}
        if path == "/api/tags":
            models = {"models": [ps_entry(name, 1, 0) for name in self.tags]}
            return self._send(handler, self.tags_body or json.dumps(models).encode())
        if path == "/api/ps":
            return self._send(handler, json.dumps({"models": [ps_entry(name, 1, 1) for name in self.loaded]}).encode())
        if path == "/api/version":
            return self.send_json(handler, 200, {"version": "0.12.0"})
        if path == "/api/generate" and doc.get("keep_alive") == 0:
            threading.Timer(self.unload_lag, self._unload, [doc.get("model")]).start()
            return self.send_json(handler, 200, {"model": doc.get("model"), "done": True, "done_reason": "unload"})
        if path in ("/api/delete", "/api/copy"):
            return self._edit(handler, path, doc)
        if path == "/api/chat":
            chunks = [{"model": doc.get("model"), "message": {"role": "assistant", "content": p}} for p in self.pieces]
            if doc.get("stream") is False:
                whole = {"model": doc.get("model"), "message": {"role": "assistant", "content": "".join(self.pieces)}}
                return self._send(handler, json.dumps(whole | {"done": True}).encode(), self.answer_headers, False)
            done = {"model": doc.get("model"), "message": {"role": "assistant", "content": ""}, "done": True}
            lines = [json.dumps(c) + "\n" for c in [*chunks, done]]
            return self._stream(handler, "application/x-ndjson", lines)
        if path == "/v1/chat/completions":
            lines = [f"data: {json.dumps({'choices': [{'delta': {'content': p}}]})}\n\n" for p in self.pieces]
            return self._stream(handler, "text/event-stream", [*lines, "data: [DONE]\n\n"])
        self.send_json(handler, 404, {"error": f"path {path} not found"})

    def _edit(self, handler, path: str, doc: dict) -> None:
        """Delete or copy one of `tags`, as Ollama answers: 200 with no body, or its 404."""
        name = doc.get("source") if path == "/api/copy" else doc.get("model") or doc.get("name")
        if name not in self.tags:
            return self.send_json(handler, 404, {"error": f"model '{name}' not found"})
        self.tags = [*self.tags, doc["destination"]] if path == "/api/copy" else [t for t in self.tags if t != name]
        handler.send_response(200)
        handler.send_header("Content-Length", "0")
        handler.end_headers()

    def _unload(self, name) -> None:
        self.loaded = [n for n in self.loaded if n != name]

    def _send(self, handler, body: bytes, headers: dict[str, str] | None = None, listing: bool = True) -> None:
        """A JSON answer with its Content-Length: a listing `trickle` seconds a byte, a chat cut off
        halfway when `cut`."""
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.end_headers()
        if not listing and self.cut:
            return self._drop(handler, body[: len(body) // 2])
        if not (listing and self.trickle):
            return handler.wfile.write(body)
        try:
            for byte in body:
                handler.wfile.write(bytes([byte]))
                handler.wfile.flush()
                time.sleep(self.trickle)
        except OSError:  # the client gave up on the trickle
            handler.close_connection = True

    @staticmethod
    def _drop(handler, sent: bytes) -> None:
        handler.wfile.write(sent)
        handler.wfile.flush()
        handler.close_connection = True
        handler.connection.shutdown(2)  # mid-body: the client sees a dropped connection

    def _stream(self, handler, media_type: str, lines: list[str]) -> None:
        """Chunked, flushed piece by piece, `delay` apart; with `cut`, the connection drops after the second
        piece, before the terminating chunk."""
        handler.send_response(200)
        handler.send_header("Content-Type", media_type)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("X-Stand-In", "yes")
        for key, value in self.answer_headers.items():
            handler.send_header(key, value)
        handler.end_headers()
        for number, line in enumerate(lines):
            if self.cut and number == 2:
                return self._drop(handler, b"")
            if number:
                time.sleep(self.delay)
            data = line.encode()
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.flush()
        handler.wfile.write(b"0\r\n\r\n")
