"""Passes run outside the step loop (timings at load, embeddings) on a thread started for them, which
ends after them (`apart`).

llama.cpp's CPU passes run on OpenMP, and libgomp keeps a team of worker threads for every thread that
has run a pass, for as long as that thread lives. Once it manages more threads than the machine has
cores, a thread that waits at a barrier sleeps almost at once (libgomp's throttled spin, 100 rounds,
not GOMP_SPINCOUNT's), and a pass has a barrier between every two of its operations: each then costs a
wake-up. One team left on the thread that timed the steps at load, beside the step loop's, made every
later pass of the demo pair (2 threads, 2 cores) slower for the rest of the process: `bench -k auto,4`
with a fresh cost cache made 52.1-53.2 tok/s at K=4, and 58.3-60.0 with the timing run apart (three
alternated runs each). A thread that ends takes its team with it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def apart(work: Callable[[threading.Event], T], name: str = "ollama-spec-apart") -> T:
    """`work(stop)` run on a thread of its own: its result, or its exception raised here. Interrupted
    meanwhile (Ctrl-C), `stop` is set, the work is waited for (a pass cannot be left half way: the
    caller would close the models under it; work that checks `stop` between passes ends sooner), and
    the interrupt raised."""
    stop, ended = threading.Event(), threading.Event()
    outcome: list[tuple[bool, object]] = []

    def run() -> None:
        try:
            outcome.append((True, work(stop)))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            outcome.append((False, exc))
        finally:
            ended.set()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    try:
        thread.join()
    except BaseException:
        stop.set()
        ended.wait()  # not join again: a join interrupted once may return at once (CPython 3.11)
        raise
    done, value = outcome[0]
    if not done:
        raise value  # type: ignore[misc]
    return value  # type: ignore[return-value]
