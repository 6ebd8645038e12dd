"""Run the app under uvicorn until Ctrl-C or SIGTERM, then end in-flight streams and exit cleanly."""

from __future__ import annotations

import logging
import signal
import socket
from collections.abc import Callable
from types import FrameType

import uvicorn

from ollama_spec.engine.cpu_policy import yield_on_wake
from ollama_spec.errors import InvalidSetting
from ollama_spec.server.http.app import create_app
from ollama_spec.server.serving.state import ServerState

log = logging.getLogger("ollama_spec.server")


class _Server(uvicorn.Server):
    """uvicorn's server, except that a signal first stops the generations, so the streams end now,
    and is not raised again after the shutdown (uvicorn re-raises it; we exit 0)."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]):
        super().__init__(config)
        self.on_exit = on_exit

    def run(self, sockets: list[socket.socket] | None = None) -> None:
        """Serve on this thread, which becomes the event loop's: it and the threads it starts (the step
        loops reset theirs) wait for a core when they wake rather than preempt a step (engine/cpu_policy.py)."""
        yield_on_wake()
        super().run(sockets=sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.on_exit()
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting
        else:
            self.should_exit = True


def bind(host: str, port: int) -> socket.socket:
    """A listening socket; port 0 picks a free one.

    Made with IPPROTO_TCP named: asyncio sets TCP_NODELAY only on connections whose socket says so, and
    without it every small answer (a stream's pieces, /api/version) waits ~40 ms for Nagle's algorithm."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InvalidSetting(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def build_server(state: ServerState, log_level: str = "info") -> _Server:
    config = uvicorn.Config(create_app(state), log_level=log_level, timeout_graceful_shutdown=10, lifespan="off")
    return _Server(config, state.cancel_all)


def serve(state: ServerState, sock: socket.socket, log_level: str = "info") -> None:
    """Serve on `sock` until a signal; the worker is closed afterwards."""
    server = build_server(state, log_level)
    host, port = sock.getsockname()[:2]
    log.info("serving %s on http://%s:%d (OpenAI API at /v1, Ollama API at /api)", state.serving, host, port)
    try:
        server.run(sockets=[sock])
    finally:
        state.close()
