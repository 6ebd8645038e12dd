"""A stand-in Ollama daemon over real HTTP on 127.0.0.1: answers /api/ps with what a test sets."""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GIB = 1 << 30


def ps_entry(name: str, size_gib: float, vram_gib: float) -> dict:
    """One /api/ps model, as Ollama writes it."""
    return {
        "name": name,
        "model": name,
        "size": int(size_gib * GIB),
        "size_vram": int(vram_gib * GIB),
        "digest": "0" * 64,
        "expires_at": "2026-11-30T06:00:00Z",
        "details": {"format": "gguf"},
    }


@contextmanager
def fake_daemon(models: list[dict], status: int = 200):
    """Serve /api/ps on a free loopback port; yields the base URL (for OLLAMA_HOST)."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"models": models} if status == 200 else {"error": "boom"}).encode()
            self.send_response(status if self.path == "/api/ps" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
