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


class Collected:
    """A Sink for a caller on another thread (bench, tests): the answer's items in a queue, in order."""

    def __init__(self) -> None:
        self._items: deque[tuple[str, Any]] = deque()
        self._cond = threading.Condition()

    def pieces(self, ticket: Ticket, pieces: list[Any]) -> None:
        self._put(("pieces", pieces))

    def end(self, ticket: Ticket) -> None:
        self._put(("end", None))

    def fail(self, ticket: Ticket, error: Exception) -> None:
        self._put(("fail", error))

    def _put(self, item: tuple[str, Any]) -> None:
        with self._cond:
            self._items.append(item)
            self._cond.notify()

    def __iter__(self) -> Iterator[Any]:
        """The pieces as they come; the request's error raised here."""
        while True:
            with self._cond:
                while not self._items:
                    self._cond.wait()
                kind, value = self._items.popleft()
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
