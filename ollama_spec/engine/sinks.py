"""Sinks for a request's answer from the step loop (engine/step_loop.py's `Sink`), read on another
thread: `Collected`, and `stream` that runs a request in a loop into one."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ollama_spec.engine.requests import Request
    from ollama_spec.engine.step_loop import StepLoop, Ticket


# Once its first piece has come, the reader looks for more this often instead of being woken for each
# step: a wake-up is a syscall on the step loop's thread and a turn at the GIL for the reader's, and
# on a pair whose steps take a fraction of a millisecond they cost the loop a quarter of its Python
# (the tiny pair's lone stream, 0.11 against 0.14-0.16 ms a step). The server's Mailbox does the same.
POLL_S = 0.008


class Collected:
    """A Sink for a caller on another thread (bench, tests): the answer's items in a queue, in order.
    Only the first piece, the end and a failure wake the reader; the pieces between wait for its next
    look, at most POLL_S later."""

    def __init__(self, poll_s: float = POLL_S) -> None:
        self._items: deque[tuple[str, Any]] = deque()
        self._cond = threading.Condition()
        self._poll_s = poll_s
        self._told = False  # anything has come: the reader looks by the clock from then on

    def pieces(self, ticket: Ticket, pieces: list[Any]) -> None:
        self._put(("pieces", pieces))

    def end(self, ticket: Ticket) -> None:
        self._put(("end", None))

    def fail(self, ticket: Ticket, error: Exception) -> None:
        self._put(("fail", error))

    def _put(self, item: tuple[str, Any]) -> None:
        with self._cond:
            self._items.append(item)
            if item[0] != "pieces" or not self._told:
                self._cond.notify()
            self._told = True

    def __iter__(self) -> Iterator[Any]:
        """The pieces as they come; the request's error raised here."""
        while True:
            with self._cond:
                while not self._items:
                    self._cond.wait(self._poll_s if self._told else None)
                items, self._items = self._items, deque()
            for kind, value in items:
                if kind == "fail":
                    raise value
                if kind == "end":
                    return
                yield from (piece for piece, _ in value)


def stream(loop: StepLoop, request: Request, prompt: list[int], *, runs: bool = False) -> tuple[Ticket, Iterator]:
    """Run `request` in `loop` for a caller on another thread: its ticket (the generation, once it
    runs) and its pieces as they come."""
    sink = Collected()
    return loop.submit(request, prompt, sink, runs=runs), iter(sink)
