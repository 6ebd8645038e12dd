"""A stand-in Ollama daemon over real HTTP on 127.0.0.1, for `serve --upstream`: /api/tags, /api/ps,
/api/version, /api/generate (keep_alive 0 unloads), /api/chat and /v1/chat/completions streaming slowly.

Knobs are attributes (`tags`, `loaded`, `delay`); every request is recorded with its headers and body.
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


class UpstreamDaemon(TestServer):
    def __init__(self, tags: list[str] | None = None, loaded: list[str] | None = None):
        self.tags = tags or []
        self.loaded = loaded or []
        self.pieces = ["Hel", "lo", " there"]
        self.delay = 0.3  # seconds between two streamed pieces
        self.unload_lag = 0.0  # seconds /api/ps still lists a model after keep_alive 0
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
            return self.send_json(handler, 200, {"models": [ps_entry(name, 1, 0) for name in self.tags]})
        if path == "/api/ps":
            return self.send_json(handler, 200, {"models": [ps_entry(name, 1, 1) for name in self.loaded]})
        if path == "/api/version":
            return self.send_json(handler, 200, {"version": "0.12.0"})
        if path == "/api/generate" and doc.get("keep_alive") == 0:
            threading.Timer(self.unload_lag, self._unload, [doc.get("model")]).start()
            return self.send_json(handler, 200, {"model": doc.get("model"), "done": True, "done_reason": "unload"})
        if path == "/api/chat":
            chunks = [{"model": doc.get("model"), "message": {"role": "assistant", "content": p}} for p in self.pieces]
            if doc.get("stream") is False:
                return self.send_json(
                    handler,
                    200,
                    {
                        "model": doc.get("model"),
                        "message": {"role": "assistant", "content": "".join(self.pieces)},
                        "done": True,
                    },
                )
            done = {"model": doc.get("model"), "message": {"role": "assistant", "content": ""}, "done": True}
            lines = [json.dumps(c) + "\n" for c in [*chunks, done]]
            return self._stream(handler, "application/x-ndjson", lines)
        if path == "/v1/chat/completions":
            lines = [f"data: {json.dumps({'choices': [{'delta': {'content': p}}]})}\n\n" for p in self.pieces]
            return self._stream(handler, "text/event-stream", [*lines, "data: [DONE]\n\n"])
        self.send_json(handler, 404, {"error": f"path {path} not found"})

    def _unload(self, name) -> None:
        self.loaded = [n for n in self.loaded if n != name]

    def _stream(self, handler, media_type: str, lines: list[str]) -> None:
        """Chunked, flushed piece by piece, `delay` apart."""
        handler.send_response(200)
        handler.send_header("Content-Type", media_type)
        handler.send_header("Transfer-Encoding", "chunked")
        handler.send_header("X-Stand-In", "yes")
        handler.end_headers()
        for number, line in enumerate(lines):
            if number:
                time.sleep(self.delay)
            data = line.encode()
            handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            handler.wfile.flush()
        handler.wfile.write(b"0\r\n\r\n")
