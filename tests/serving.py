"""Start the real server (uvicorn on 127.0.0.1, an ephemeral port) in a thread of the test process."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import httpx

from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.server import ServerSettings, ServerState
from ollama_spec.server.http.run import bind, build_server


@contextmanager
def running_server(engine, **settings):
    """Yield (base URL, ServerState) of a live server over `engine`; stop it afterwards."""
    settings = {"sampling": SamplingSettings(temperature=0)} | settings
    state = ServerState(engine, ServerSettings(**settings))
    with _serving(state) as url:
        yield url, state


@contextmanager
def _serving(state):
    """Serve `state` on 127.0.0.1 (a free port) in a thread; yield the base URL."""
    sock = bind("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = build_server(state, log_level="warning")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield url
    finally:
        server.should_exit = True
        state.cancel_all()
        thread.join(30)
        state.close()
        sock.close()


@contextmanager
def serving_tiny_pair(tiny_models, **settings):
    """The tiny target drafted by the tiny draft, served: yields (base URL, ServerState)."""
    from ollama_spec.engine.engine import Engine
    from tests.conftest import engine_settings

    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        with running_server(engine, **settings) as served:
            yield served


def get(url: str, **kwargs) -> httpx.Response:
    return httpx.get(url, timeout=60, **kwargs)


def post(url: str, **kwargs) -> httpx.Response:
    return httpx.post(url, timeout=60, **kwargs)


@contextmanager
def running_store(models_dir, scheduler=None, max_queue: int = 8, upstream: str | None = None, api_key=None, **pairs):
    """Yield (base URL, ServerState) of a live server over the whole store at `models_dir`, its models
    loaded on demand (`scheduler`: SchedulerSettings; `upstream`: the URL of a daemon to stand in front
    of, as serve --upstream; `pairs`: StorePairs' fields); stop it afterwards."""
    from ollama_spec.server.http.upstream import Upstream
    from ollama_spec.server.serving.pairs import StorePairs
    from ollama_spec.server.serving.scheduler import Scheduler, SchedulerSettings
    from tests.conftest import engine_settings

    pairs = {"engine": engine_settings(parallel=1)} | pairs
    store = StorePairs(models_dir=str(models_dir), **pairs)
    settings = ServerSettings(sampling=SamplingSettings(temperature=0), max_queue=max_queue, api_key=api_key)
    state = ServerState(None, settings, Scheduler(store, scheduler or SchedulerSettings(), None, max_queue))
    state.upstream = Upstream(upstream, own_key=bool(api_key)) if upstream else None
    with _serving(state) as url:
        yield url, state


@contextmanager
def serve_process(models_dir, *args: str):
    """Yield (base URL, Popen) of `ollama-spec serve ARGS` in a process of its own on 127.0.0.1 (a free
    port), so that what would end it (a crash, a signal) ends only it; kill it afterwards."""
    command = [sys.executable, "-c", "from ollama_spec.cli import main; main()", "serve", *args, "--port", "0",
               "--threads", "1", "--no-check", "--models-dir", str(models_dir)]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in process.stderr:
            found = re.search(r"on (http://127\.0\.0\.1:\d+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "the server did not say where it listens"
        threading.Thread(target=process.stderr.read, daemon=True).start()  # keep the pipe drained
        yield url, process
    finally:
        process.kill()
        process.wait()
