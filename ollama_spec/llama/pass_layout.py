"""Which passes one loaded model's evaluations take: one sequence's as it comes, several consecutive
sequences' as they come where nothing needs laying out, else the passes plan_passes lays out
(passes.py) or n_batch chunks. The model's settings for it, in one place."""

from __future__ import annotations

from collections.abc import Sequence

from ollama_spec.llama.passes import Entry, PassCosts, chunked, piece_size, plan_passes, taken_whole

Item = tuple[int, Sequence[int], int]  # (sequence, tokens, rows of logits for the last of them)


class PassLayout:
    """A model's passes: `n_seq` sequences each in a stream of `stream` positions (`cached[seq]`: the
    tokens a sequence holds), `exact` rows where each row must be computed as it is alone."""

    def __init__(self, n_batch: int, n_seq: int, stream: int, cached: list[list[int]], *, exact: bool, flash_off: bool):
        self.n_batch = n_batch
        self._stream, self._cached = stream, cached
        # passes laid out by plan_passes: with several streams, llama.cpp takes a pass whole only where
        # its sequences are consecutive with equally many tokens each
        self.plans = n_seq > 1
        self.exact = self.plans and exact  # each row computed as it is alone (passes.py)
        self._piece = piece_size(n_batch, n_seq, self.exact)
        # without flash attention, attention's own products over one row of a sequence take vec_dot
        self.min_rows = 2 if flash_off and self.exact else 1
        self.pass_costs = PassCosts()  # what a pass more costs, for the passes' layout

    def alone(self, item: Item) -> bool:
        """Whether one sequence's item is one pass as it comes: at most a batch; where rows are exact, a
        piece at most, without padding, and not one row of logits (which plan_passes widens)."""
        n = len(item[1])
        if not self.exact:
            return n <= self.n_batch
        return max(self.min_rows, 2) <= n <= min(self._piece, self.n_batch) and item[2] >= 2

    def whole(self, items: Sequence[Item]) -> bool:
        """Whether several sequences' items are the one pass `passes` would lay out of them, their tokens
        as they come: consecutive sequences, equally many tokens each (taken_whole where rows are
        exact). One sequence's is not (`alone`, or chunks of a batch)."""
        if len(items) == 1:
            return False
        if not self.exact:
            return _side_by_side(items, self.n_batch)
        return taken_whole(items, self._piece, self._room, self.n_batch, self.min_rows, exact=True)

    def passes(self, items: Sequence[Item]) -> list[list[Entry]]:
        """With several sequences, passes llama.cpp takes whole (passes.py), whose rows each get the
        kernels they get alone where rows are exact; else (one sequence, a draft's side-by-side rows, or
        no room left for padding at a context's end) n_batch chunks as they come."""
        if self.plans and (self.exact or not _side_by_side(items, self.n_batch)):
            pass_rows = self.pass_costs.pass_rows
            planned = plan_passes(
                items,
                self._piece,
                self._room,
                self.n_batch,
                pass_rows=pass_rows,
                min_rows=self.min_rows,
                exact=self.exact,
            )
            if planned is not None:
                return planned
        return chunked(items, self.n_batch)

    def _room(self, seq: int) -> int:
        """Positions left in sequence `seq`'s stream."""
        return self._stream - len(self._cached[seq])


def _side_by_side(items: Sequence[Item], n_batch: int) -> bool:
    """Whether llama.cpp takes the items as they come without a pass more than their n_batch chunks:
    one sequence's, or consecutive sequences in order with equally many tokens each, n_batch in all
    (a draft's step across its slots: one token each)."""
    first, width = items[0][0], len(items[0][1])
    if len(items) == 1:
        return True
    return width * len(items) <= n_batch and all(
        seq == first + i and len(tokens) == width for i, (seq, tokens, _) in enumerate(items)
    )
