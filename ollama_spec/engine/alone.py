"""A request alone is the step loop with one slot: `Engine.generate`'s generation, iterated, runs
through the loop's admission, its K choice and its timed passes (step_loop.py), as served requests do.

When the loop has nothing else to run, the caller's thread runs its turns itself and yields each
turn's text as it comes: no second thread and no hand-off between threads for each step. When the
loop's thread is running other requests, the request joins them there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from ollama_spec.engine.sinks import Collected
from ollama_spec.engine.step_loop import StepLoop, Ticket


class _Here:
    """A Sink read by the thread that runs the turns, between them: nothing to lock or wake."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self.ended = False
        self.error: Exception | None = None

    def pieces(self, ticket: Ticket, pieces: list[tuple[Any, int]]) -> None:
        self.items += [piece for piece, _ in pieces]

    def end(self, ticket: Ticket) -> None:
        self.ended = True

    def fail(self, ticket: Ticket, error: Exception) -> None:
        self.ended, self.error = True, error


def run_alone(loop: StepLoop, slot: int, generation: Any, runs: bool = False) -> Iterator[Any]:
    """`generation` (made for sequence `slot`) run in `loop`: its pieces of text (Runs with `runs`) as
    each turn verifies them; its error raised. Closing the iterator ends the request (at the loop's
    next step), its caches keeping what was accepted."""
    ticket = Ticket(generation.request, generation.prompt(), Collected(), runs, generation=generation, slot=slot)
    if loop.queue(ticket, here=True):  # this thread runs the turns: the loop's thread sleeps till `let_go`
        ticket.sink = answer = _Here()
        try:
            while not answer.ended:
                loop.run_turn()
                if answer.items:
                    yield from answer.items
                    answer.items = []
        finally:
            try:
                if not answer.ended:
                    ticket.cancel()
                    loop.run_turn()  # the slot freed, its steps closed: the caches keep what was accepted
            finally:
                loop.let_go()
        if answer.error is not None:
            raise answer.error
        return
    ended = False  # the loop's thread runs it: its pieces as they come, its error raised (Collected)
    try:
        yield from ticket.sink
        ended = True
    except Exception:
        ended = True
        raise
    finally:
        if not ended:
            ticket.cancel()
