"""How `serve` runs: the listening socket it binds (the connections asyncio accepts on it send small
writes at once), and the event loop's thread, which yields the cores to the step loop's when it wakes."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
import time

import httpx
import pytest

from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.server import ServerSettings, ServerState
from ollama_spec.server.http.run import bind, build_server


def test_accepted_connections_have_tcp_nodelay():
    """Without it each small answer (a stream's pieces, /api/version) waits ~40 ms for Nagle's algorithm
    and the client's delayed ACK: asyncio sets TCP_NODELAY only where the socket names IPPROTO_TCP."""

    async def accepted_nodelay() -> int:
        found: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def connected(reader, writer) -> None:
            sock = writer.get_extra_info("socket")
            found.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        listening = bind("127.0.0.1", 0)
        server = await asyncio.start_server(connected, sock=listening)
        async with server:
            _, writer = await asyncio.open_connection(*listening.getsockname()[:2])
            value = await asyncio.wait_for(found, 10)
            writer.close()
        return value

    assert asyncio.run(accepted_nodelay()) != 0


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's scheduling policies")
def test_the_event_loop_thread_yields_on_wake_and_the_step_loop_does_not(tiny_models):
    """Served, the event loop's thread (and the threads it starts) is SCHED_BATCH: its wake-ups, several a
    streamed request, wait for a core rather than preempt the step loop mid-step; the step loop's own
    thread, started by the first request, stays an ordinary one."""
    from ollama_spec.engine.engine import Engine
    from tests.conftest import engine_settings

    body = {"model": "tiny-target", "prompt": "Once", "max_tokens": 8, "stream": True, "temperature": 0}
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        state = ServerState(engine, ServerSettings(sampling=SamplingSettings(temperature=0)))
        sock = bind("127.0.0.1", 0)
        server = build_server(state, log_level="warning")
        thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
        thread.start()
        try:
            deadline = time.monotonic() + 30
            while not server.started:
                assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
                time.sleep(0.02)
            url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/completions"
            with httpx.stream("POST", url, json=body, timeout=60) as response:
                assert response.status_code == 200 and list(response.iter_lines())
            assert os.sched_getscheduler(thread.native_id) == os.SCHED_BATCH
            assert os.sched_getscheduler(engine.loop._thread.native_id) == os.SCHED_OTHER
        finally:
            server.should_exit = True
            thread.join(30)
            state.close()
            sock.close()
