"""`apart`: work on a thread of its own, which ends after it and takes llama.cpp's OpenMP team along."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from ollama_spec.llama.loading import LoadSettings
from ollama_spec.llama.model import LoadedModel
from ollama_spec.llama.threads import apart


def test_the_work_runs_on_a_thread_of_its_own_and_its_result_comes_back():
    caller = threading.get_ident()
    ran_on = apart(lambda stop: threading.get_ident())
    assert ran_on != caller


def test_the_works_exception_is_raised_to_the_caller():
    def fails(stop):
        raise ValueError("no such batch")

    with pytest.raises(ValueError, match="no such batch"):
        apart(fails)


@pytest.mark.skipif(not hasattr(signal, "pthread_kill"), reason="needs POSIX signals")
def test_an_interrupt_waits_for_the_work_which_is_told_to_stop():
    ended = []

    def waits(stop):
        stopped = stop.wait(10)
        ended.append(stopped)
        return "done"

    # a run started in the background (nohup, `&` in a script) ignores SIGINT: Python's own handler here
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    try:
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            apart(waits)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, handler)
    assert ended == [True]  # told to stop, and ended before the interrupt went on


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts the process's threads in /proc")
def test_no_openmp_team_is_left_behind_after_passes_run_apart(tiny_models):
    with LoadedModel(tiny_models[0].path, LoadSettings(n_ctx=256, n_threads=2)) as model:
        before = _threads()
        apart(lambda stop: model.eval(list(range(300, 340))))
        deadline = time.monotonic() + 5
        while _threads() > before and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _threads() == before
        # on a thread that lives on, its team stays: what apart spares the step loop
        done, stay = threading.Event(), threading.Event()
        keeper = threading.Thread(target=lambda: (model.eval([5, 6, 7]), done.set(), stay.wait(5)))
        keeper.start()
        done.wait(5)
        assert _threads() >= before + 2  # the thread and its OpenMP worker
        stay.set()
        keeper.join()
