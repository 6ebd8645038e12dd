"""Which slot a request runs in, and the prompt prefixes that outlive their slot.

A request goes to a free slot next to the busy ones, and among those to the one whose cache shares
the longest prefix with its prompt (llama-server's rule), so a chat's next turn lands where its
history already is. Next to the busy ones first: a batch pass spans the sequences from the lowest
busy slot to the highest, each idle one between them padded like the others (llama/passes.py), so
two clients in slots 0 and 5 of 8 paid six sequences' rows in every pass: 36-40 tok/s where slots
next to each other made 60-65, on the demo pair, from one run to the next as the prompts fell. The
prefix a far slot holds comes along through host RAM (saved there, restored in the near one). A slot whose
cache the request would mostly throw away is saved first, both models' cells, to host RAM
(bounded, least recently used first out), and a request whose prompt starts with a saved prefix
gets it back: a chat front-end's background requests (a title, tags) between two turns of a chat
cost the chat nothing. A slot freed with a cache worth saving has each model make host memory ready
for its save (`expect_save`, until the slot is taken: `drop_save`; llama/host_memory.py), so that
the save, when it comes, does not wait for the system to hand that memory over.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from ollama_spec.decoding.proposers import common_prefix

DEFAULT_SAVED_MIB = 1024
# A cache shorter than this is not worth saving: re-reading it costs less than the copy.
MIN_SAVED_TOKENS = 64


class SlotModel(Protocol):
    """A loaded model with sequences: what the pool reads and saves of each."""

    def cached_of(self, seq: int) -> list[int]: ...
    def save_sequence(self, seq: int) -> bytes | bytearray | memoryview: ...
    def expect_save(self, seq: int, most: int) -> None: ...
    def drop_save(self, seq: int) -> None: ...
    def restore_sequence(self, seq: int, state: bytes | bytearray | memoryview, tokens: Sequence[int]) -> bool: ...
    def clear_sequence(self, seq: int) -> None: ...


@dataclass
class _Saved:
    tokens: tuple[int, ...]  # the target's
    states: tuple[tuple[bytes | bytearray | memoryview, tuple[int, ...]], ...]  # each model's cells and tokens

    @property
    def size(self) -> int:
        return sum(len(state) for state, _ in self.states)


class SlotPool:
    """`n_slots` sequences of `models` (target first): acquire one for a prompt, release it after."""

    def __init__(self, models: Sequence[SlotModel], n_slots: int, saved_mib: int = DEFAULT_SAVED_MIB):
        self.models, self.n_slots = list(models), n_slots
        self.budget = saved_mib * 1024 * 1024
        self._lock = threading.Lock()
        self._free = list(range(n_slots))
        self._last_used = dict.fromkeys(range(n_slots), 0.0)
        self._saved: OrderedDict[tuple[int, ...], _Saved] = OrderedDict()  # least recently used first
        self._saved_bytes = 0
        self.restored_tokens = 0  # prompt tokens brought back from host RAM

    @property
    def target(self) -> SlotModel:
        return self.models[0]

    def release(self, seq: int) -> None:
        """Slot `seq` is free again; its cache may be saved when another prompt takes it (`acquire`)."""
        if len(self.target.cached_of(seq)) >= MIN_SAVED_TOKENS:
            for model in self.models:
                model.expect_save(seq, self.budget)
        with self._lock:
            self._last_used[seq] = time.monotonic()
            self._free.append(seq)

    def acquire(self, prompt: Sequence[int], seq: int | None = None) -> int:
        """The free slot for `prompt`, its cache made as useful as can be (see the module's docstring).
        It saves and restores cells: no batch may run on these models meanwhile. `seq`: that slot
        itself, as its cache is (a caller that chose it); RuntimeError when it is busy."""
        if seq is not None:
            return self._take(seq)
        with self._lock:
            if not self._free:
                raise RuntimeError("no free slot: the caller runs at most n_slots requests at once")
            busy = [s for s in range(self.n_slots) if s not in self._free]
            shared = {seq: common_prefix(self.target.cached_of(seq), prompt) for seq in self._free}
            # the fewest idle slots inside the busy span; then the longest shared prefix; else an empty
            # slot; else the one used longest ago
            seq = max(
                self._free,
                key=lambda s: (-_idle_between(busy, s), shared[s], not self.target.cached_of(s), -self._last_used[s]),
            )
            holder = max(self._free, key=lambda s: shared[s])  # where the prompt's prefix is
            self._free.remove(seq)
        self._drop_saves(seq)
        if holder != seq and shared[holder] >= MIN_SAVED_TOKENS and shared[holder] > shared[seq]:
            self._save(holder, self.target.cached_of(holder))  # brought to `seq` through host RAM, below
        saved = self._best_saved(prompt)
        if saved is not None and common_prefix(saved.tokens, prompt) <= shared[seq]:
            saved = None
        if saved is not None:
            with self._lock:  # used: the last to go, even to the save below
                if saved.tokens in self._saved:
                    self._saved.move_to_end(saved.tokens)
        cached = self.target.cached_of(seq)
        if len(cached) - shared[seq] >= MIN_SAVED_TOKENS and shared[seq] < len(cached) // 2:
            self._save(seq, cached)
        if saved is not None:
            self._restore(seq, saved)
        return seq

    def _take(self, seq: int) -> int:
        with self._lock:
            if seq not in self._free:
                raise RuntimeError(f"slot {seq} is busy")
            self._free.remove(seq)
        self._drop_saves(seq)
        return seq

    def _drop_saves(self, seq: int) -> None:
        """Slot `seq` is taken: no model makes memory ready for saving its cache as it is."""
        for model in self.models:
            model.drop_save(seq)

    def _save(self, seq: int, cached: list[int]) -> None:
        key = tuple(cached)
        if self._held(seq, key):
            return
        states = tuple((model.save_sequence(seq), tuple(model.cached_of(seq))) for model in self.models)
        saved = _Saved(key, states)
        if saved.size > self.budget:
            return
        with self._lock:
            if (earlier := self._saved.pop(key, None)) is not None:
                self._saved_bytes -= earlier.size
            self._saved[key] = saved
            self._saved_bytes += saved.size
            while self._saved_bytes > self.budget:
                self._saved_bytes -= self._saved.popitem(last=False)[1].size

    def _held(self, seq: int, key: tuple[int, ...]) -> bool:
        """Is the slot's cache saved already, as it is in every model (a long prompt sent again, restored
        and left as it was)? Then it is only used again: a save is tens of MB written to memory the
        host has to hand over afresh (on this VM 25 ms up to a quarter of a second for the demo target's
        2,000 tokens, with every slot's pass waiting)."""
        with self._lock:
            saved = self._saved.get(key)
            if saved is None:
                return False
            if any(tuple(model.cached_of(seq)) != tokens for model, (_, tokens) in zip(self.models, saved.states)):
                return False
            self._saved.move_to_end(key)
            return True

    def _best_saved(self, prompt: Sequence[int]) -> _Saved | None:
        with self._lock:
            return max(self._saved.values(), key=lambda s: common_prefix(s.tokens, prompt), default=None)

    def _restore(self, seq: int, saved: _Saved) -> None:
        for model, (state, tokens) in zip(self.models, saved.states):
            if not model.restore_sequence(seq, state, tokens):
                for other in self.models:  # never one model's cells without the other's
                    other.clear_sequence(seq)
                return
        self.restored_tokens += len(saved.tokens)


def _idle_between(busy: Sequence[int], seq: int) -> int:
    """Free slots inside the span of the busy ones and `seq`: each is padding in every batch pass."""
    members = [*busy, seq]
    return max(members) - min(members) + 1 - len(members)
