"""The scheduler waits on events, never on a clock it polls: a load that does not fit waits for the busy pair
to be released and closed, and a keep_alive ends when it runs out. Every asyncio.sleep the server's modules
make is recorded; none may be made. Real engines over the tiny store, driven on one event loop."""

from __future__ import annotations

import asyncio
import math
import sys

import pytest

from ollama_spec.server.serving.metrics import Metrics
from ollama_spec.server.serving.pairs import StorePairs
from ollama_spec.server.serving.scheduler import Scheduler, SchedulerSettings
from tests.conftest import engine_settings

REAL_SLEEP = asyncio.sleep


@pytest.fixture
def polls(monkeypatch) -> list[tuple[str, float]]:
    """(module, seconds) of each asyncio.sleep a module of ollama_spec.server makes."""
    made: list[tuple[str, float]] = []

    async def recorded(delay, *args, **kwargs):
        caller = sys._getframe(1).f_globals.get("__name__", "")
        if caller.startswith("ollama_spec.server"):
            made.append((caller, delay))
        return await REAL_SLEEP(delay, *args, **kwargs)

    monkeypatch.setattr(asyncio, "sleep", recorded)
    return made


def scheduler(store, **settings) -> Scheduler:
    pairs = StorePairs(models_dir=str(store), no_draft=True, engine=engine_settings(parallel=1))
    return Scheduler(pairs, SchedulerSettings(**settings), Metrics(lambda: 0), max_queue=4)


async def until(condition, seconds: float = 30.0) -> None:
    """Wait (on the test's own clock) until `condition()` holds, at most `seconds`."""
    for _ in range(int(seconds / 0.02)):
        if condition():
            return
        await REAL_SLEEP(0.02)
    raise AssertionError("it did not happen in time")


def test_a_load_that_does_not_fit_waits_for_the_release_not_a_clock(tiny_store, polls):
    async def scenario():
        owner = scheduler(tiny_store, max_loaded=1, load_timeout=60)
        busy = await owner.acquire("tiny-alien", None)  # a request holds the only room
        waiting = asyncio.ensure_future(owner.acquire("tiny-target", None))
        await REAL_SLEEP(1.0)  # the load has planned and now waits for room
        assert not waiting.done() and list(owner.loaded) == ["tiny-alien:latest"]
        await owner.release(busy)
        served = await asyncio.wait_for(waiting, 60)
        assert busy.closed and list(owner.loaded) == ["tiny-target:latest"]
        await owner.release(served)
        owner.shutdown()

    asyncio.run(scenario())
    assert polls == []


def test_a_keep_alive_ends_on_its_time_not_at_a_poll(tiny_store, polls):
    async def scenario():
        owner = scheduler(tiny_store)
        served = await owner.acquire("tiny-alien", 0.5)
        await owner.release(served)
        assert list(owner.loaded) == ["tiny-alien:latest"]  # kept for its keep_alive
        await until(lambda: served.closed)
        assert owner.loaded == {}
        owner.shutdown()

    asyncio.run(scenario())
    assert polls == []


def test_a_pair_is_loaded_with_the_keep_alive_of_the_request_that_loads_it(tiny_store):
    """/api/ps may be asked between a pair's load and the loading request's turn: the pair already carries
    the keep_alive that request asked for (here forever), not the server's default."""

    async def scenario():
        owner = scheduler(tiny_store)
        at_load = []
        watch = owner.resident.watch
        owner.resident.watch = lambda served: (at_load.append(served.keep_alive), watch(served))[1]
        served = await owner.acquire("tiny-alien", math.inf)
        assert at_load == [math.inf] and served.keep_alive == math.inf
        await owner.release(served)
        owner.shutdown()

    asyncio.run(scenario())
