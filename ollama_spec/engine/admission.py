"""Waiting requests into the step loop's free slots (engine/step_loop.py): each ticket its sequence (the
pool's rule: engine/slots.py), its generation and its steps, in arrival order."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ollama_spec.decoding.evals import Eval
from ollama_spec.engine.prompt_chunks import ChunkSizer
from ollama_spec.engine.tickets import Ticket, not_started


@dataclass
class Slot:
    """A request as the step loop holds it: its sequence, its ticket, its steps and what they want next."""

    seq: int
    ticket: Ticket
    steps: Iterator
    wanted: Eval | None = None
    model: Any = None  # the loaded model `wanted` is for, and the sequence in it (`model_of`)
    wanted_seq: int = 0
    view: Any = None  # `wanted.model`, which `model` and `wanted_seq` were worked out from


def admit_waiting(
    engine: Any,
    waiting: deque[Ticket],
    lock: threading.Condition,
    slots: dict[int, Slot],
    chunks: ChunkSizer,
    start: Callable[[Slot], None],
) -> list[Slot]:
    """The `waiting` tickets (guarded by `lock`) into `engine`'s free slots, in arrival order, each put in
    `slots` and its steps begun (`start`) before the next is taken; a cancelled or failed one told so
    through its sink. A generation with a prompt chunk reads it as `chunks` says. The slots it filled."""
    free, fresh = engine.slots - len(slots), []
    while free > 0 and waiting:  # read without the lock: what comes meanwhile waits a turn
        with lock:
            ticket = waiting.popleft() if waiting else None
        if ticket is None:
            break
        if ticket.cancelled:
            ticket.sink.fail(ticket, not_started())
            continue
        try:  # a generation made for its sequence (Engine.generate's) runs there
            seq = engine.pool.acquire(ticket.prompt, ticket.slot)
        except Exception as exc:  # noqa: BLE001 - the request fails; the others go on
            ticket.sink.fail(ticket, exc)
            continue
        ticket.slot = seq
        ticket.generation = generation = ticket.generation or engine.generate(
            ticket.request, use_draft=ticket.use_draft, slot=seq, stop=lambda ticket=ticket: ticket.cancelled
        )
        generation.prompt = lambda prompt=ticket.prompt: prompt
        if generation.prompt_chunk:  # the batch's bound, and the time's beside running streams
            chunks.piece, generation.prompt_chunk = generation.prompt_chunk, chunks.take
        slot = Slot(seq, ticket, generation.steps(runs=ticket.runs))
        slots[seq] = slot
        free -= 1
        start(slot)
        fresh.append(slot)
    return fresh


def model_of(wanted: Eval) -> tuple[Any, int]:
    """The loaded model and sequence an evaluation is for (a SequenceView is one sequence of one)."""
    view = wanted.model
    return (view.model, view.seq) if hasattr(view, "seq") else (view, 0)
