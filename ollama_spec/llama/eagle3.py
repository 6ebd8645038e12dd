"""An EAGLE-3 draft head beside a loaded target: its own llama.cpp context over the head's GGUF.

The head follows every target pass (`passed`, called by the target after each llama_decode): the
target captures the inputs of the head's three layers for every token it reads; the head's encoder
turns each row into g, and its decoder cache takes the pair (next token, g) at each position whose
next token the pass holds. At memory position P the decoder reads (t[P+1], g[P]) (llama.cpp's
convention, common/speculative.cpp): the last position of a pass has no next token yet, so its g
waits (`pending`) until a draft step completes it with the target's latest token, or the next pass
(a prompt read in chunks) with its first. When the target's cache is cut back (`truncated`: after
verification, a reused prefix), the head cuts its own and takes the pending g from the last pass's
rows at the new boundary. Drafting (`HeadSequence`) runs the decoder on its own output: each step's
pre-norm state is the next step's g; afterwards the head keeps only what the target read.

The head's passes are few: the rows a target pass captured and the pairs it completes wait until
the head's next draft step, which encodes the rows of every drafting sequence in one encoder pass and
decodes the pairs in the same pass as the step's own row, only as far as the target kept them; where
no draft step came between (K=0), the rows wait on with the next pass's, up to a batch of them, so a
step without drafting costs the head a copy of its rows. Where the K policy says a sequence will not
draft for a while (`idle`), the head leaves its passes unread but for the last few, which a probe's
window reads. A draft step of every drafting sequence is one pass (`decode_many`, as a draft model's:
the engine's step loop batches the sequences' steps).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp._internals import LlamaContext, LlamaModel

from ollama_spec.errors import InferenceError, ModelLoadError
from ollama_spec.llama.head_calls import head_calls
from ollama_spec.llama.head_check import check_head
from ollama_spec.llama.head_passes import MERGED_ROWS, HeadPasses
from ollama_spec.llama.head_rows import _Sequence, append_rows, pack_state, unpack_state
from ollama_spec.llama.head_sequences import HeadSequence
from ollama_spec.llama.kv_cache import read_cells, write_cells
from ollama_spec.llama.log import is_verbose, last_error, log_mark
from ollama_spec.llama.passes import Entry

ARCHITECTURE = "eagle3"


@dataclass(frozen=True)
class HeadSettings:
    n_gpu_layers: int = -1  # as a draft model's: part of -k auto's cost key


class Eagle3Head(HeadPasses):
    """The head's model and context, tied to `target` (a llama.model.LoadedModel): it borrows the
    target's token embeddings and output matrix where it has none of its own (ctx_other)."""

    CONTEXT_TYPE: int | None = None  # llama.cpp's default context, reading the head's own GGUF
    CONTEXT_NAME = "a context for the head"  # in the error when llama.cpp cannot make it

    def __init__(self, path, target, *, n_gpu_layers: int = -1):
        self.calls = head_calls()
        self.path, self.target = Path(path), target
        self.settings = HeadSettings(n_gpu_layers)
        mark = log_mark()
        params = llama_cpp.llama_model_default_params()
        params.n_gpu_layers = 0x7FFFFFFF if n_gpu_layers < 0 else n_gpu_layers
        try:
            self._model = LlamaModel(path_model=str(path), params=params, verbose=is_verbose())
        except ValueError as exc:
            raise ModelLoadError(f"llama.cpp could not load the head {path}: {last_error(mark) or exc}") from None
        try:
            check_head(self, ARCHITECTURE)
            self._ctx = self._context(mark)
        except ModelLoadError:
            self._model.close()
            raise
        self.n_embd = llama_cpp.llama_model_n_embd(self._model.model)
        self._zero = np.zeros(self.n_embd, dtype=np.float32)
        self.n_vocab = target.n_vocab
        self.n_batch = llama_cpp.llama_n_ubatch(self._ctx.ctx)
        self._batch = llama_cpp.llama_batch_ext_init(self._ctx.ctx)
        self._state = [_Sequence() for _ in range(target.n_seq)]
        self._lock = threading.RLock()  # target passes (the batch's thread) and drafts (slots' threads)
        self.calls.set_nextn(self._ctx.ctx, True, True)  # g and pre-norm states, of output rows only
        tgt = target.llama_context
        for layer in self.layers:
            if layer < self.target_layers:
                self.calls.set_layer_inp(tgt, layer, True)
            else:  # the target's final pre-norm state
                self.calls.set_nextn(tgt, True, False)
        target.observer = self

    def _context(self, mark) -> LlamaContext:
        target = self.target
        params = llama_cpp.llama_context_default_params()
        if self.CONTEXT_TYPE is not None:
            params.ctx_type = self.CONTEXT_TYPE
        params.n_ctx = target.settings.n_ctx * target.n_seq
        # a target pass of n_batch tokens and the pending pair before it
        params.n_batch = params.n_ubatch = target.n_batch + 1
        params.n_seq_max = target.n_seq
        # one unified cache, unlike a draft model's streams (llama/loading.py): its decoder pass hands its
        # first rows out as outputs and its positions must rise through it, which llama.cpp's split of a
        # pass over several streams into equal pieces would break; its rows only choose what is proposed
        params.kv_unified = target.n_seq > 1
        params.n_threads = params.n_threads_batch = target.n_threads
        params.no_perf = True
        params.ctx_other = target.llama_context
        try:
            return LlamaContext(model=self._model, params=params, verbose=is_verbose())
        except ValueError:
            raise ModelLoadError(
                f"llama.cpp could not create {self.CONTEXT_NAME} {self.path}: {last_error(mark) or 'out of memory?'}"
            ) from None

    # --- following the target -------------------------------------------------------------
    def passed(self, entries: Sequence[Entry], positions: Sequence[int]) -> None:
        """After a target llama_decode of `entries` at `positions`: keep their captured rows (encoded
        when a draft step or a cut needs their g); the pairs whose next token the pass holds wait for
        the next draft step (padding entries are skipped)."""
        by_seq: dict[int, list[int]] = {}
        for i, entry in enumerate(entries):
            if entry.item is not None:
                by_seq.setdefault(entry.seq, []).append(i)
        if not by_seq:
            return
        order = [i for rows in by_seq.values() for i in rows]
        together = order == list(range(order[0], order[0] + len(order)))
        with self._lock:
            features = self._features(len(entries), slice(order[0], order[0] + len(order)) if together else order)
            behind: list[tuple[int, int, int, np.ndarray]] = []  # (seq, position, token, g)
            offset = 0
            for seq, rows in by_seq.items():
                seq_f, offset = features[offset : offset + len(rows)], offset + len(rows)
                behind += self._follow(seq, seq_f, positions[rows[0]], positions[rows[-1]])
            self._decode_all(behind)

    def passed_run(self, seq: int, first: int, n: int) -> None:
        """After a target llama_decode of `n` tokens of sequence `seq` alone, at positions `first` on
        (a lone step's pass, without an Entry a token): as `passed`, unless the sequence is idle there."""
        state = self._state[seq]
        if first + n <= state.asleep_until:
            state.slept = True
            return
        with self._lock:
            behind = self._follow(seq, self._features(n, slice(0, n)), first, first + n - 1)
            if behind:
                self._decode_all(behind)

    def _follow(self, seq: int, seq_f: np.ndarray, first: int, last: int) -> list[tuple[int, int, int, np.ndarray]]:
        """Sequence `seq`'s part of a target pass (its captured rows `seq_f`, at positions `first` to
        `last`) kept; the pairs to decode now, before them."""
        state = self._state[seq]
        state.asleep_until = 0
        if state.end > first:
            self._cut(seq, first)
        if state.slept:  # passes went unfollowed (idle): the rows start again here, nothing decoded now
            state.slept, state.before = False, None
            state.rows, state.raw, state.pending = (first, seq_f), True, (last, None)
            return []
        # the rows the next pairs take g from: those no draft step took (K=0), then this pass's; where
        # they begin past the cache's end (passes went unfollowed), the pairs before them have none
        start, kept = min(state.end, first - 1), state.rows
        if kept is not None and kept[0] > start:
            start = kept[0]
        waits = kept is not None and kept[0] + len(kept[1]) == first
        if waits and state.end < first and first - start + len(seq_f) <= self.n_batch:
            if state.raw:  # rows of one kind: encoded or not
                state.rows = (start, append_rows(state, kept[1][start - kept[0] :], seq_f, self.n_batch))
                state.pending = (last, None)
            else:
                new = self._encode(seq_f)
                state.rows = (start, np.vstack([kept[1][start - kept[0] :], new]))
                state.pending = (last, new[-1])
            return []
        behind = []
        if state.end < first:  # pairs wait that the new rows cannot join: decoded now
            self._settle([seq])
            behind = self._gap(seq, first)
        at = state.pending  # the boundary's g before this pass, for a cut back to it
        state.before = at if at is not None and at[0] == first - 1 and at[1] is not None else None
        state.rows, state.raw, state.pending = (first, seq_f), True, (last, None)
        return behind

    def _settle(self, seqs) -> None:
        """Encode the rows of `seqs` that wait as the target captured them, in one encoder pass."""
        raw = [seq for seq in dict.fromkeys(seqs) if self._state[seq].raw and self._state[seq].rows is not None]
        if not raw:
            return
        rows = [self._state[seq].rows[1] for seq in raw]
        g = self._encode(rows[0] if len(rows) == 1 else np.concatenate(rows))
        offset = 0
        for seq in raw:
            state = self._state[seq]
            first, n = state.rows[0], len(state.rows[1])
            state.rows, state.raw, offset = (first, g[offset : offset + n]), False, offset + n
            if state.pending is not None and state.pending[1] is None:
                state.pending = (state.pending[0], state.rows[1][state.pending[0] - first])

    def truncated(self, seq: int, n_tokens: int) -> None:
        """The target's sequence `seq` now holds `n_tokens` tokens: drop the pairs that read a token
        past them, and take the pending g at the new boundary from the last pass's rows."""
        with self._lock:
            state = self._state[seq]
            state.asleep_until = 0
            self._cut(seq, max(n_tokens - 1, 0))
            boundary = n_tokens - 1
            if state.rows is not None:  # the rows past the boundary read tokens that are gone
                first, rows = state.rows
                state.rows = (first, rows[: n_tokens - first]) if n_tokens > first else None
                state.raw = state.raw and state.rows is not None
            if state.pending is not None and state.pending[0] == boundary:
                return
            if state.before is not None and state.before[0] == boundary:
                state.pending = state.before
                return
            state.pending = None
            if state.rows is not None and 0 <= boundary - state.rows[0] < len(state.rows[1]):
                state.pending = (boundary, None if state.raw else state.rows[1][boundary - state.rows[0]])

    def _gap(self, seq: int, position: int) -> list[tuple[int, int, int, np.ndarray]]:
        """The pairs the head lacks before `position` (llama.cpp takes a sequence's positions only in
        order), each with the target's next token: g from the last pass's rows, or the pending g, else
        a zero g (a cache cut or restored past what the head kept: only the drafts' quality can suffer)."""
        state = self._state[seq]
        if state.end >= position:
            return []
        cached = self.target.cached_of(seq)
        first, rows = state.rows if state.rows is not None else (0, ())
        pairs = []
        for p in range(state.end, position):
            if 0 <= p - first < len(rows):
                g = rows[p - first]
            elif state.pending is not None and state.pending[0] == p:
                g = state.pending[1]
            else:
                g = state.before[1] if state.before is not None and state.before[0] == p else self._zero
            pairs.append((seq, p, cached[p + 1], g))
        return pairs

    def _decode_all(self, pairs: Sequence[tuple[int, int, int, np.ndarray]]) -> None:
        for start in range(0, len(pairs), self.n_batch):
            self._decode(pairs[start : start + self.n_batch])

    def _cut(self, seq: int, position: int) -> None:
        state = self._state[seq]
        if state.end > position:
            self._quick.seq_rm(self._memory, seq, position, -1)
            state.end = position

    # --- drafting --------------------------------------------------------------------------
    def sequence(self, seq: int) -> HeadSequence:
        """Sequence `seq` as the EAGLE-3 proposer drafts with it."""
        return HeadSequence(self, seq)

    def idle(self, seq: int, n_tokens: int, steps: int, keep: int) -> None:
        """Sequence `seq`, whose target holds `n_tokens`, will not draft for the next `steps` steps of
        one token each (the K policy at K=0, a probe no nearer): the passes before the last `keep` of
        them go unfollowed, and the head reads only those, as a probe's window does (`begin`).

        Following a pass costs the head ~9 us of Python on the tiny pair, 7 % of a step at K=0. A draft
        that comes sooner than said (`begin` ends the idling) finds the unfollowed positions without
        their g, as after a cut past what the head kept: only its drafts' quality can suffer."""
        state = self._state[seq]
        state.asleep_until = n_tokens + steps - keep if steps > keep else 0

    def begin(self, seq: int, n_tokens: int, window: int = 0) -> bool:
        """Start drafting after a text of `n_tokens + 1` tokens whose first `n_tokens` the target holds:
        the first step reads (the text's last token, the pending g at the boundary). False when the
        head has no g there (the target has not read that far with the head beside it).

        With `window` (a probe), where the head lacks more pairs than that (steps at K=0 left them
        waiting), it reads only the last `window` of them, placed after what its cache holds, and
        drops them again when drafting is over (`drafted`): the rest still wait, encoded as they were
        or not. Reading them all costs a pass as long as the gap at every probe, and the first probe
        of a request reads the prompt's too (1-2 ms on the tiny pair, 10-20 target steps); each
        row's g already carries what the target read before it."""
        with self._lock:
            state = self._state[seq]
            state.asleep_until = 0
            pending = state.pending
            ready = pending is not None and pending[0] == n_tokens - 1
            state.drafting = (n_tokens - 1, pending[1]) if ready else None
            state.window = None
            if ready and window and n_tokens - 1 - state.end > window and state.rows is not None:
                self._open_window(seq, n_tokens - 1, window)
            return ready

    def _open_window(self, seq: int, boundary: int, window: int) -> None:
        """Draft from `boundary` after only the `window` pairs before it (see `begin`), where the last
        pass's rows hold them."""
        state = self._state[seq]
        first, rows = state.rows
        low = boundary - window
        if low < first or boundary - first >= len(rows):
            return
        span = rows[low - first : boundary - first + 1]
        g = self._encode(span) if state.raw else span
        cached, at = self.target.cached_of(seq), state.end
        pairs = [(seq, at + i, cached[low + i + 1], g[i]) for i in range(window)]
        state.window, state.drafting = (at, pairs), (at + window, g[window])

    def rows_asked(self, tokens: Sequence[int], logits: str | int, seq: int = 0) -> int:
        """A draft step reads one token and gives its row (LoadedModel.rows_asked's contract)."""
        if len(tokens) != 1 or logits not in ("last", "all", 1):
            raise ValueError(f"a head's draft step reads one token and gives its row, not {len(tokens)}: {logits!r}")
        return 1

    def decode_many(self, items: Sequence[tuple[int, Sequence[int], int]]) -> list[np.ndarray]:
        """One draft step of each (sequence, [token], 1), all in one decoder pass (with the pairs each
        sequence's last target pass left waiting): each step's logits over the target's vocabulary
        (1 × V); its pre-norm state is the sequence's next step's g."""
        with self._lock:
            behind, steps = [], []
            raw = [seq for seq, _, _ in items if self._state[seq].raw and self._state[seq].window is None]
            if raw:
                self._settle(raw)
            for seq, tokens, _ in items:
                state = self._state[seq]
                if state.drafting is None:
                    raise InferenceError(f"the head's sequence {seq} drafts without a boundary to draft from")
                position, g = state.drafting
                if g is None:  # the boundary's g, encoded just now
                    g = state.pending[1]
                self._cut(seq, position)
                if state.window is None:
                    behind += self._gap(seq, position)
                elif state.window[1]:  # a probe's window: its pairs ride with its first step
                    behind += state.window[1]
                    state.window = (state.window[0], [])
                steps.append((seq, position, tokens[-1], g))
            # llama.cpp's eagle3 decoder graph computes every row's logits and hands its first rows out as
            # a pass's outputs (src/models/eagle3.cpp selects none), and a sequence's positions must rise
            # through a pass: the waiting pairs share the steps' pass as outputs too, where they are few
            if len(behind) + len(steps) > MERGED_ROWS:
                self._decode_all(behind)
                behind = []
            pairs = sorted([*behind, *steps], key=itemgetter(0, 1)) if behind or len(steps) > 1 else steps
            self._decode(pairs, outputs=True)
            ctx, view, rows = self._ctx.ctx, self._g_io.view, []
            # a step is its sequence's last pair in the pass: the pairs behind it are at earlier positions
            index = {pair[0]: i for i, pair in enumerate(pairs)}
            for seq, position, _, _ in steps:
                i = index[seq]
                logits = view(self.calls.logits_ith_at(ctx, i), 1, self.n_vocab)
                g = view(self.calls.nextn_ith_at(ctx, i), 1, self.n_embd)
                if logits is None or g is None:
                    raise InferenceError(f"the EAGLE-3 head's decoder gave no row {i}")
                self._state[seq].drafting = (position + 1, g[0].copy())
                rows.append(logits.copy())
            return rows

    def drafted(self, seq: int, n_tokens: int) -> None:
        """Drafting from a target that holds `n_tokens` is over: keep the pair that completed the
        boundary (it reads the target's own token), drop the drafts' pairs."""
        with self._lock:
            state = self._state[seq]
            state.drafting = None
            if state.window is not None:  # a probe's window: gone again, the pairs it lacks still wait
                self._cut(seq, state.window[0])
                state.window = None
                return
            self._cut(seq, n_tokens)

    # --- a slot's prefix in host RAM ---------------------------------------------------------
    def save_state(self, seq: int) -> bytes:
        """Sequence `seq`'s cells and the g rows it drafts and cuts from (engine/slots.py keeps a
        slot's prefix in host RAM: the head's part of it)."""
        with self._lock:
            self._settle([seq])
            state, cells = self._state[seq], b""
            if state.end:
                cells = read_cells(self._ctx.ctx, seq)
            return pack_state(state, cells)

    def restore_state(self, seq: int, saved: bytes) -> bool:
        """Sequence `seq` as `save_state` gave it; False (and the sequence empty) when llama.cpp
        cannot take its cells back."""
        with self._lock:
            self._cut(seq, 0)
            state, cells = unpack_state(saved, self.n_embd)
            if cells and not write_cells(self._ctx.ctx, seq, cells):
                llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self._ctx.ctx), seq, -1, -1)
                self._state[seq] = _Sequence()
                return False
            self._state[seq] = state
            return True

    def close(self) -> None:
        if getattr(self.target, "observer", None) is self:
            self.target.observer = None
        if self._batch is not None:
            llama_cpp.llama_batch_ext_free(self._batch)
            self._batch = None
        self._ctx.close()
        self._model.close()
