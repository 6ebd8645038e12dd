"""How many of a prompt's tokens a request being read puts in each turn of the step loop, and which
prompts' last pieces it reads at once, in a pass of their own (`read_at_once`).

At most the batch's piece (llama/passes.py: under 64 tokens of a sequence a pass, all sequences in the
batch). And while other requests generate, at most what costs them about one more step of their own: on
a CPU a prompt token costs nearly what a verify row does, and at 2,000 tokens in, attention over the cache
makes a 63-token chunk cost 5-8 of the streams' steps (the demo pair) or hundreds (the tiny pair), every
turn until the prompt is read. Bounded so, the streams keep at least about half their speed while a long
prompt is read; the prompt reads no fewer than MIN_CHUNK tokens a turn. Where a prompt token costs
little beside the step (a GPU), the piece is the bound. Nobody generating: the piece.

A prompt of at most FIRST_TOKEN_PIECES pieces is read in whole pieces beside streams too, so that its first
token comes within about two of their steps of its time alone: a piece is read whole by its first step, at
once; two, the first in the turn it comes, the last at once at the next turn's start. Each of the streams'
gaps then grows by one piece's pass at most, the bound a long prompt's chunks keep too.

Timed from the loop's turns: a turn that read no prompt times the step, one that read some times what
its prompt tokens added; both decayed, so the bound follows the machine and the prompt's position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MIN_CHUNK = 16  # prompt tokens a turn at least: a long prompt still gets read
FIRST_TOKEN_PIECES = 2  # a prompt of at most this many pieces is read in whole ones (see the module)
DECAY = 0.7  # per timed turn: both times follow the last few turns


@dataclass
class ChunkSizer:
    """The chunk bound of one step loop (see the module); `piece` is the batch's bound."""

    piece: int
    step_s: float | None = None  # a turn that read no prompt, as timed
    token_s: float | None = None  # what a prompt token added to a turn, as timed
    _started: float | None = None
    generating: bool = False  # some request is past its prompt (the loop says so before it admits)
    _reading: bool = False  # some request was being read in it
    _read: int = 0  # prompt tokens handed out for the turn under way
    _next_read: int = 0  # prompt tokens handed out since it began: the next turn reads them

    def turn(self, now: float, generating: bool, reading: bool, *, waited: bool = False) -> None:
        """A turn's passes begin at `now` (the loop's admissions done): the turn before is timed, unless
        the loop may have `waited` for work since. `generating`: some request is past its prompt;
        `reading`: some request is not."""
        if self._started is not None and self.generating and not waited:
            seconds = now - self._started
            if not self._reading:
                self.step_s = _decayed(self.step_s, seconds)
            elif self._read and self.step_s is not None:
                self.token_s = _decayed(self.token_s, max(0.0, seconds - self.step_s) / self._read)
        self._started, self.generating, self._reading = now, generating, reading
        self._read, self._next_read = self._next_read, 0

    def reading(self) -> None:
        """A request admitted after the turn began reads its prompt in it: the turn is not timed as a step."""
        self._reading = True

    def take(self, left: int, whole: int) -> int:
        """Prompt tokens to read in the next turn, of the `left` still unread before the first step's
        (0: the first step reads them), of a prompt that had `whole` to read: one that fits a piece is
        read whole by its first step, one of FIRST_TOKEN_PIECES in whole pieces, so that a short prompt's
        first token is not put off by the bound."""
        if whole <= self.piece:
            return 0
        size = self.piece
        short = whole <= FIRST_TOKEN_PIECES * self.piece
        if self.generating and not short and self.step_s is not None and self.token_s:
            size = max(MIN_CHUNK, min(size, int(self.step_s / self.token_s)))
        if left <= size:
            return 0
        self._next_read += size
        return size


def _decayed(old: float | None, new: float) -> float:
    return new if old is None else DECAY * old + (1 - DECAY) * new


def read_at_once(slots: dict[int, Any], target: Any) -> list[Any]:
    """Of the step loop's slots, those whose next evaluation is the last piece of their prompt (read whole by
    its first step: all of a short prompt, the rest of a chunked one), read at once in a target pass of their
    own, their next step at K=0 (the draft has not read that piece); none unless some slot generates. Else
    the piece waits for the others' draft passes, then shares their verify pass, padded to its width or split
    off (llama/passes.py): a step later, for a first token that comes with it. A chunk before the last
    stays one a turn in the others' passes."""
    if all(not s.ticket.generation.result.tokens for s in slots.values()):
        return []
    last = [
        s
        for s in slots.values()
        if s.model is target
        and not s.ticket.generation.result.tokens
        and len(s.model.cached_of(s.wanted_seq)) + len(s.wanted.tokens) == len(s.ticket.prompt)
    ]
    for slot in last:  # an AutoK's next step at K=0 (the step loop sets a shared step's K on it)
        if getattr(slot.ticket.generation.policy, "shared_k", 0) is None:
            slot.ticket.generation.policy.shared_k = 0
    return last
