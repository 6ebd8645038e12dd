"""What the step loop (engine/step_loop.py) takes in and hands out: a request as admitted (`Ticket`),
where its answer goes (`Sink`), and a pass as it ran (`Pass`, for bench's ceiling)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ollama_spec.engine.requests import Request
from ollama_spec.errors import OllamaSpecError

if TYPE_CHECKING:
    from ollama_spec.engine.generation import Generation


@dataclass(frozen=True)
class Pass:
    """One llama_decode call as it ran: which model (0 the target, 1 the draft), how many sequences,
    tokens and rows of logits, the most tokens of one sequence, and its seconds."""

    model: int
    sequences: int
    tokens: int
    rows: int
    widest: int
    seconds: float


class Sink(Protocol):
    """Where a request's answer goes, called on the loop's thread (just before its next pass: see
    `StepLoop._send`): the pieces of text (`Run`s with `runs`) each step verified, in one call (each
    call may wake the reader's thread: once a step, not once a token), each with how many of the
    Result's `scored` tokens it completes; then once `end` (the Result is the generation's) or `fail`."""

    def pieces(self, ticket: Ticket, pieces: list[tuple[Any, int]]) -> None: ...
    def end(self, ticket: Ticket) -> None: ...
    def fail(self, ticket: Ticket, error: Exception) -> None: ...


@dataclass
class Ticket:
    """One admitted request: its prompt as tokens, where its answer goes, and once it has a slot, its
    generation (whose `result` fills as it runs)."""

    request: Request
    prompt: list[int]
    sink: Sink
    runs: bool = False  # pieces as Runs (which text the draft wrote), not plain text
    use_draft: bool = True  # False: the target alone (the baseline)
    generation: Generation | None = None
    slot: int | None = None  # the sequence it runs in, once admitted
    cancelled: bool = False  # set by any thread: the slot is freed at the next step

    def cancel(self) -> None:
        self.cancelled = True


class NotStarted(OllamaSpecError):
    """A request cancelled before it had a slot."""


def not_started() -> NotStarted:
    return NotStarted("the request was cancelled before it started")
