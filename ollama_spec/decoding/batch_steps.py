"""The slots whose steps run as one batch, as each slot's K policy sees the others.

With B slots batched (llama/batcher.py), a step is every slot's draft passes and one verify pass
for all of them. A slot's drafts pay when they make the batch's step yield more tokens per second,
not when they beat what this slot would make alone: a slot whose drafts are seldom accepted drafts
nothing while the others draft, and a slot's next token must beat the rate of the whole batch.

Each AutoK keeps its own decayed tokens and seconds per step, the seconds being its part of the
batches as its own clock times them (StepBatcher.others_seconds: the slots' parts add up to the
batch's time). The batch's step is then the sum of the slots' steps, and `beside(slot)` is the sum
of the others'. A slot alone has nothing beside it, and its rule is the single-slot one.
"""

from __future__ import annotations

import threading
import weakref
from typing import Protocol

from ollama_spec.decoding.step_costs import ALONE, Beside


class SlotSteps(Protocol):
    def per_step(self) -> tuple[float, float]:
        """This slot's expected tokens per step, and its seconds of each step."""
        ...


class BatchSteps:
    """The K policies of the requests running at once on one engine's slots."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # weak: a policy whose request failed before it could leave goes with its request
        self._members: weakref.WeakSet[SlotSteps] = weakref.WeakSet()

    def join(self, member: SlotSteps) -> None:
        with self._lock:
            self._members.add(member)

    def leave(self, member: SlotSteps) -> None:
        with self._lock:
            self._members.discard(member)

    def __len__(self) -> int:
        with self._lock:
            return len(self._members)

    def beside(self, member: SlotSteps) -> Beside:
        """What the other members yield and cost per step, summed."""
        with self._lock:
            others = [m for m in self._members if m is not member]
        if not others:
            return ALONE
        tokens = seconds = 0.0
        for other in others:
            t, s = other.per_step()
            tokens, seconds = tokens + t, seconds + s
        return Beside(tokens, seconds)
