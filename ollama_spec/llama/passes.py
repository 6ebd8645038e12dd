"""Several sequences' evaluations laid out so that each row's arithmetic is the one it gets alone.

With one KV stream per sequence (model.py), a row's result still depends on the pass it runs in,
because llama.cpp's CPU kernels change with the shape of the pass (ggml-cpu, llama.cpp 0.3.36):

- a matrix product over one row takes ggml's vec_dot, over two or more llamafile's tinyBLAS, which
  sums in another order; the last layer and the output matrix run over the rows whose logits are
  read, so those count apart;
- flash attention over 64 or more rows of one sequence takes a tiled kernel, and one row of one
  sequence over 512 or more cells splits the cells between threads: both sum in other orders than
  the row-by-row kernel every verify batch gets;
- llama.cpp splits a batch over several streams into passes of equally many tokens per sequence, of
  consecutive sequences only, leaving odd rows alone in passes of their own.

So every pass here is one llama.cpp computes whole, and each row gets the same kernels whatever
else runs: a pass takes at most `piece` (< 64) tokens of each sequence, every sequence from the
lowest to the highest in it the same number, made up with padding tokens after a sequence's own
(causal attention: nothing real sees them, and they are cut off after the pass); at least two rows
in all, and two rows of logits whenever any is read. A row is then computed the same way alone, beside
other slots, in a verify batch of any size or in a prompt read in pieces from a cached prefix.

A draft's rows only choose what is proposed (`exact=False`): its passes keep the one rule llama.cpp's
streams impose, the padding that makes the sequences of a pass consecutive and equally long, and
nothing for the kernels' sake.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

FLASH_TILE_ROWS = 64  # ggml-cpu's GGML_FA_TILE_Q: from this many rows of a sequence, the tiled kernel
PASS_DECAY = 0.95  # per pass: the fit follows a model's last ~20 passes
DEFAULT_PASS_ROWS = 16.0  # before any pass was timed: a CPU's is a few rows, a GPU's far more


class Entry(NamedTuple):  # made for every token of every pass: a tuple costs half a frozen dataclass
    seq: int
    token: int
    logits: bool  # llama.cpp computes its row of logits
    item: int | None  # the item whose token it is; None: padding, cut off after the pass
    row: bool = False  # its row of logits goes to the item (else it is read only to make two rows)


def piece_size(n_batch: int, n_seq: int, exact: bool = True) -> int:
    """Tokens of each sequence in one pass: all sequences in n_batch, under the tiled kernel's threshold
    where rows are `exact`."""
    return max(1, min(FLASH_TILE_ROWS - 1 if exact else n_batch, n_batch // n_seq))


def plan_passes(
    items: Sequence[tuple[int, Sequence[int], int]],
    piece: int,
    room: Callable[[int], int],
    limit: int,
    *,
    pass_rows: float = DEFAULT_PASS_ROWS,
    pad_token: int = 0,
    min_rows: int = 1,
    exact: bool = True,
) -> list[list[Entry]] | None:
    """The passes for (sequence, tokens, rows of logits) items, each a list of entries in the order
    llama.cpp reads them (sequence by sequence); None where no such layout exists: two items of one
    sequence, no room in a sequence's stream for its padding (`room(seq)`: positions left), or a
    pass over `limit` tokens (the context's batch).
    `min_rows`: tokens each sequence brings to a pass at least (2 where attention runs without flash
    attention: its products over one row of a sequence take vec_dot too). `pass_rows`: what one pass
    more costs, in rows (PassCosts): each pass takes the width that costs least (`_width`). Without
    `exact` (a draft's rows), a pass is padded only as llama.cpp's streams need: no second row for a
    lone one, none of logits."""
    seqs = [seq for seq, _, _ in items]
    if len(set(seqs)) != len(seqs):
        return None
    if taken_whole(items, piece, room, limit, min_rows, exact):
        return [_flat(items)]
    queue = {seq: _entries(index, seq, tokens, n_rows) for index, (seq, tokens, n_rows) in enumerate(items)}
    used = dict.fromkeys(queue, 0)  # positions each sequence's passes have taken so far (padding is cut off)
    passes = []
    while active := sorted(seq for seq, left in queue.items() if left):
        lowest, highest = active[0], active[-1]
        width = _width([min(piece, len(queue[seq])) for seq in active], highest - lowest + 1, pass_rows)
        width = max(width, min_rows, 2 if lowest == highest and exact else 1)  # two rows at least: never vec_dot
        entries: list[Entry] = []
        for seq in range(lowest, highest + 1):  # consecutive: a sequence between them takes padding only
            if room(seq) - used.get(seq, 0) < width:
                return None
            own = queue.get(seq, [])[:width]
            if own:
                del queue[seq][: len(own)]
                used[seq] += len(own)
            entries += own + [Entry(seq, pad_token, False, None)] * (width - len(own))
        if exact and sum(entry.logits for entry in entries) == 1:  # one row of logits would go through vec_dot
            spare = next(i for i, entry in enumerate(entries) if not entry.logits)
            entries[spare] = entries[spare]._replace(logits=True)
        if len(entries) > limit:
            return None
        passes.append(entries)
    return passes


def taken_whole(
    items: Sequence[tuple[int, Sequence[int], int]],
    piece: int,
    room: Callable[[int], int],
    limit: int,
    min_rows: int,
    exact: bool,
) -> bool:
    """Whether the items need nothing laid out, their pass the one plan_passes makes of them: their
    tokens as they come (a step's verify batch, as a rule). Consecutive sequences in order, equally
    many tokens each, at most a piece, at least the rows a pass takes, not one row of logits alone,
    room for them all."""
    first, width = items[0][0], len(items[0][1])
    if not (max(min_rows, 2 if exact and len(items) == 1 else 1) <= width <= piece and width * len(items) <= limit):
        return False
    logits = 0
    for i, (seq, tokens, n_rows) in enumerate(items):
        if seq != first + i or len(tokens) != width or room(seq) < width:
            return False
        logits += n_rows
    return not (exact and logits == 1)  # one row of logits alone: the layout reads a second one


def _width(lengths: Sequence[int], span: int, pass_rows: float) -> int:
    """Tokens of each sequence in the next pass: the longest one's (the others padded up to it), or a
    shorter one that leaves the longer ones' rest to another pass, whichever costs fewer rows with the
    pass that rest takes. A prompt read beside verify batches gets a pass of its own for the most
    of it (four slots padded to a 50-token prompt: 200 rows, not 28 + 43 and a pass); verify batches
    of 3 to 9 tokens get one padded pass where a pass costs more than a few rows."""

    def cost(width: int) -> float:
        rest = sum(max(0, n - width) for n in lengths)
        return span * width + (pass_rows + rest if rest else 0.0)

    return min(sorted(set(lengths), reverse=True), key=cost)


class PassCosts:
    """A model's pass seconds as a + c·rows, fitted to its passes: what a pass more costs, in rows (a/c)."""

    def __init__(self) -> None:
        self._sums = (0.0, 0.0, 0.0, 0.0, 0.0)  # Σw, Σw·n, Σw·n², Σw·t, Σw·n·t

    def observe(self, rows: int, seconds: float) -> None:
        w, wn, wnn, wt, wnt = self._sums
        d = PASS_DECAY
        self._sums = (d * w + 1.0, d * wn + rows, d * wnn + rows * rows, d * wt + seconds, d * wnt + rows * seconds)

    @property
    def pass_rows(self) -> float:
        w, wn, wnn, wt, wnt = self._sums
        spread = w * wnn - wn * wn
        if spread <= 1e-9 * max(w * w, 1e-30):
            return DEFAULT_PASS_ROWS  # all passes of one size so far: nothing to tell a from c
        per_row = (w * wnt - wn * wt) / spread
        fixed = (wt - per_row * wn) / w
        return DEFAULT_PASS_ROWS if per_row <= 0 else max(0.0, fixed / per_row)


def chunked(items: Sequence[tuple[int, Sequence[int], int]], n_batch: int) -> list[list[Entry]]:
    """The items' tokens as they come, in passes of n_batch: one sequence's layout (llama.cpp splits
    a pass over several streams as it must)."""
    flat = _flat(items)
    return [flat[start : start + n_batch] for start in range(0, len(flat), n_batch)]


def _flat(items: Sequence[tuple[int, Sequence[int], int]]) -> list[Entry]:
    """Every item's entries, item after item, as they come."""
    return [
        entry for index, (seq, tokens, n_rows) in enumerate(items) for entry in _entries(index, seq, tokens, n_rows)
    ]


def _entries(index: int, seq: int, tokens: Sequence[int], n_rows: int) -> list[Entry]:
    """Item `index`'s tokens, the last `n_rows` with their rows of logits read and returned."""
    first = len(tokens) - n_rows
    return [Entry(seq, token, i >= first, index, i >= first) for i, token in enumerate(tokens)]
