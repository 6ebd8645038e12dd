"""`bench --concurrency N` without --url: the pair served in this process as `serve` serves it, on
127.0.0.1 at a free port, for the --url bench to time over HTTP; stopped however the bench ends.

It joins two faces, `bench/` and `server/`, so it lives in `cli/`, the one face that imports others."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace

import httpx

from ollama_spec.bench.remote import ServerError
from ollama_spec.bench.runner import engine_settings
from ollama_spec.bench.settings import BenchSettings, parse_k_list
from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.parameters import K, resolve_k
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine
from ollama_spec.errors import InsufficientMemory, InvalidSetting
from ollama_spec.models.resolve import ResolvedModel
from ollama_spec.server import ServerSettings, ServerState
from ollama_spec.server.http.run import bind, build_server

LOOPBACK = "127.0.0.1"  # only the bench's own clients call it: never reachable from the network
START_TIMEOUT_S = 30.0  # the pair is loaded before the server starts: this is uvicorn's start alone
STOP_TIMEOUT_S = 30.0  # past build_server's graceful shutdown (10 s)


def served_k(text: str | None, params: Mapping) -> int | None:
    """The one K the server drafts at (None: auto). `text` is -k as given (None: not given); without it,
    as serve: the model's (or its preset's) K, else auto, by the rule every face resolves K by."""
    if text is None:
        return resolve_k(params, {})
    fixed, auto = parse_k_list(text)
    if len(fixed) + auto != 1:
        raise InvalidSetting(f"-k '{text}': a server drafts at one K, so with --concurrency give -k one number or auto")
    return resolve_k(params, {K: fixed[0] if fixed else None})


@contextmanager
def served_pair(
    target: ResolvedModel,
    draft: ResolvedModel | None,
    settings: BenchSettings,
    slots: int,
    k: int | None,
    notice: Callable[[str], None] = lambda text: None,
) -> Iterator[str]:
    """Load the pair with `slots` slots (the memory plan checked for all of them, as serve checks it; `draft`
    None: the target's own MTP layers draft, `settings.mtp`), serve it on 127.0.0.1 at a free port in a thread
    of this process, and yield its API base (http://127.0.0.1:PORT/v1) once /health answers. The server stops
    and the pair unloads however the block ends (an error, Ctrl-C)."""
    speculation = SpeculationSettings(num_speculative_tokens=k)
    server_settings = ServerSettings(
        host=LOOPBACK,
        port=0,
        sampling=SamplingSettings(temperature=settings.temperature, seed=settings.seed),
        speculation=speculation,
    )
    try:
        engine = Engine(target, draft, replace(engine_settings(settings), parallel=slots), notice=notice)
    except InsufficientMemory as exc:  # the plan's advice names serve's flag; here the slots are the clients
        raise InsufficientMemory(str(exc).replace("--parallel ", "--concurrency ")) from None
    with engine:
        if engine.slots < slots:  # a recurrent target: its state cannot be cut back per sequence
            notice(f"{target.name} runs one request at a time: the {slots} clients take turns")
        engine.costs.prepare(speculation)  # as serve does: K auto's timing is not charged to the first requests
        state = ServerState(engine, server_settings)
        try:
            with _serving(state) as base:
                yield base + "/v1"
        finally:
            state.close()


@contextmanager
def _serving(state: ServerState) -> Iterator[str]:
    """uvicorn over `state` in a thread, on 127.0.0.1 at a free port; yields the base URL once /health is ok."""
    sock = bind(LOOPBACK, 0)
    try:
        server = build_server(state, log_level="warning")
        # daemon: a server that would not stop cannot keep the command from exiting
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="bench-server", daemon=True)
        thread.start()
        base = f"http://{LOOPBACK}:{sock.getsockname()[1]}"
        try:
            _wait_ready(base, server, thread)
            yield base
        finally:
            server.should_exit = True
            state.cancel_all()  # streams still open (Ctrl-C mid-request) end now, not after their max tokens
            thread.join(STOP_TIMEOUT_S)
    finally:
        sock.close()


def _wait_ready(base: str, server, thread: threading.Thread) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if not thread.is_alive():
            raise ServerError("the bench's own server stopped as it started (see the log above)")
        if server.started:
            try:
                if httpx.get(base + "/health", timeout=2).json().get("status") == "ok":
                    return
            except (httpx.HTTPError, ValueError):
                pass  # not answering yet
        time.sleep(0.05)
    raise ServerError(f"the bench's own server at {base} did not answer /health within {START_TIMEOUT_S:.0f} s")
