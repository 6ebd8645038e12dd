"""The step loop's thread runs as an ordinary thread, whatever the thread that started it runs as."""

import os
import threading

import pytest

from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from tests.conftest import engine_settings

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux's scheduling policies")


class Policies:
    """A Sink that notes the scheduling policy of the thread each call comes on (the loop's)."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.done = threading.Event()

    def pieces(self, ticket, pieces) -> None:
        self.seen.append(os.sched_getscheduler(0))

    def end(self, ticket) -> None:
        self.seen.append(os.sched_getscheduler(0))
        self.done.set()

    def fail(self, ticket, error) -> None:
        self.done.set()


def test_a_loop_started_from_a_batch_thread_runs_its_steps_as_an_ordinary_thread(tiny_models):
    """The server's event loop thread is SCHED_BATCH (it waits for a core when it wakes) and starts the
    loop's thread with the first request: the steps must not inherit that, or every other thread's wake-up
    could put them off."""
    sink = Policies()
    request = Request("Once", raw=True, max_tokens=8, ignore_eos=True, sampling=SamplingSettings(temperature=0))
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:

        def submit_as_batch() -> None:
            os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
            engine.submit(request, sink)

        submitter = threading.Thread(target=submit_as_batch)
        submitter.start()
        submitter.join(30)
        assert sink.done.wait(60)
    assert sink.seen and set(sink.seen) == {os.SCHED_OTHER}


def test_a_policy_a_user_chose_stays():
    """Only the ordinary policy becomes SCHED_BATCH, and only SCHED_BATCH becomes ordinary again: a server
    started under `chrt` (here SCHED_IDLE, which needs no privilege) keeps what it was given."""
    from ollama_spec.engine.cpu_policy import run_normally, yield_on_wake

    seen = []

    def chosen() -> None:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        yield_on_wake()
        seen.append(os.sched_getscheduler(0))
        run_normally()
        seen.append(os.sched_getscheduler(0))

    thread = threading.Thread(target=chosen)
    thread.start()
    thread.join(10)
    assert seen == [os.SCHED_IDLE, os.SCHED_IDLE]
