"""Collected: a request's answer read on another thread, its reader woken only when it must be."""

import queue
import threading

import pytest

from ollama_spec.engine.sinks import Collected


def reading(sink: Collected) -> tuple[queue.Queue, threading.Thread]:
    """A reader on a thread of its own: each piece it takes, then None at the end (or the error)."""
    taken: queue.Queue = queue.Queue()

    def read() -> None:
        try:
            for piece in sink:
                taken.put(piece)
            taken.put(None)
        except Exception as exc:  # noqa: BLE001 - handed to the test
            taken.put(exc)

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return taken, thread


def test_the_first_piece_and_the_end_wake_the_reader_the_pieces_between_wait_for_its_look():
    sink = Collected(poll_s=60.0)  # a look by the clock never comes within the test
    taken, thread = reading(sink)
    sink.pieces(None, [("Once", 1)])
    assert taken.get(timeout=10) == "Once"  # woken for it
    sink.pieces(None, [(" upon", 2), (" a", 3)])
    with pytest.raises(queue.Empty):
        taken.get(timeout=0.3)  # not woken: it waits for the reader's next look
    sink.pieces(None, [(" time", 4)])
    sink.end(None)  # woken: everything before the end comes with it, in order
    assert [taken.get(timeout=10) for _ in range(4)] == [" upon", " a", " time", None]
    thread.join(10)


def test_the_reader_looks_by_the_clock_for_pieces_once_the_first_has_come():
    sink = Collected(poll_s=0.01)
    taken, _ = reading(sink)
    sink.pieces(None, [("a", 1)])
    assert taken.get(timeout=10) == "a"
    sink.pieces(None, [("b", 2)])  # no wake-up: its look finds it
    assert taken.get(timeout=10) == "b"
    sink.end(None)
    assert taken.get(timeout=10) is None


def test_a_failure_comes_after_the_pieces_before_it_and_ends_the_reading():
    sink = Collected(poll_s=60.0)
    taken, _ = reading(sink)
    sink.pieces(None, [("a", 1)])
    sink.pieces(None, [("b", 2)])
    sink.fail(None, RuntimeError("the pass failed"))
    assert taken.get(timeout=10) == "a"
    assert taken.get(timeout=10) == "b"
    error = taken.get(timeout=10)
    assert isinstance(error, RuntimeError) and str(error) == "the pass failed"
