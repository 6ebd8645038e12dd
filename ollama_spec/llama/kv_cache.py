"""What each sequence of a loaded model holds in llama.cpp's KV cache: the record of its tokens, the
passes that append to it, the cuts that shorten it, its cells saved and restored."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp
from llama_cpp._internals import LlamaContext

from ollama_spec.errors import ContextFull, InferenceError
from ollama_spec.llama.host_memory import HostMemory
from ollama_spec.llama.passes import Entry


class SequenceCache:
    """The sequences of one context, `tokens[seq]` the ids in its cache, in order (a next request may
    reuse them); `observer` (an EAGLE-3 head or MTP layers beside a target) is told of every pass
    and every cut."""

    def __init__(self, ctx: LlamaContext, n_seq: int, n_batch: int, window: int, name: str):
        self.tokens: list[list[int]] = [[] for _ in range(n_seq)]
        self.unsettled: set[int] = set()  # sequences a decode ran on whose tokens `tokens` may not hold yet
        self.observer = None
        self.host = HostMemory()  # where saves go, touched before they come (`expect_save`)
        self._ctx, self._memory = ctx.ctx, ctx.memory
        self._window = window  # a window cache's window (0: every position is kept)
        self._name = name
        self._batch = batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        # the batch's arrays, each reached once: an attribute of the ctypes struct is a new pointer
        # object at every access, six of them for every token of every pass
        self._token, self._pos, self._logits = batch.token, batch.pos, batch.logits
        self._seq_ids = [batch.seq_id[i] for i in range(n_batch)]
        for i in range(n_batch):
            batch.n_seq_id[i] = 1  # every token is in one sequence

    def decode(self, entries: Sequence[Entry]) -> None:
        """One llama_decode of `entries`, each after what its sequence holds; padding is cut off after."""
        seqs = {entry.seq for entry in entries}
        for seq in seqs:
            self.settle(seq)
        batch, next_pos = self._batch, {seq: len(self.tokens[seq]) for seq in seqs}
        batch.n_tokens = len(entries)
        token, pos, logits, seq_ids = self._token, self._pos, self._logits, self._seq_ids
        for i, entry in enumerate(entries):
            seq = entry.seq
            token[i], logits[i], pos[i] = entry.token, entry.logits, next_pos[seq]
            next_pos[seq] += 1
            seq_ids[i][0] = seq
        self.unsettled |= seqs  # until `tokens` says what llama.cpp holds now
        self._run(batch)
        positions = [batch.pos[i] for i in range(len(entries))] if self.observer is not None else []
        cached = self.tokens
        for entry in entries:  # in order within each sequence: one look at each, not one a sequence
            if entry.item is not None:
                cached[entry.seq].append(entry.token)
        for seq in seqs:
            if next_pos[seq] > len(cached[seq]):  # padding: gone again before anything reads the cache
                llama_cpp.llama_memory_seq_rm(self._memory, seq, len(cached[seq]), -1)
        self.unsettled -= seqs
        if self.observer is not None:  # the head reads this pass's captured rows before the next pass
            self.observer.passed(entries, positions)

    def decode_tokens(self, seq: int, tokens: Sequence[int], n_rows: int) -> None:
        """`decode` of one sequence's `tokens` (at most a batch), rows of logits for the last `n_rows`:
        the same pass without an Entry a token (a lone step's passes), the observer told of it as one run."""
        self.settle(seq)
        batch, cached = self._batch, self.tokens[seq]
        at = len(cached)
        batch.n_tokens = n = self._fill(0, seq, tokens, n_rows)
        self.unsettled.add(seq)
        self._run(batch)
        cached.extend(tokens)
        self.unsettled.discard(seq)
        if self.observer is not None:  # the head reads this pass's captured rows before the next pass
            self.observer.passed_run(seq, at, n)

    def decode_runs(self, runs: Sequence[tuple[int, Sequence[int], int]]) -> None:
        """`decode` of several (sequence, tokens, rows) runs' tokens as they come, one run a sequence, at
        most a batch in all, rows of logits for each run's last `rows`: the same pass without an Entry a
        token (a step's beside other slots that needs nothing laid out: passes.taken_whole). Not beside
        an observer, which reads a pass of several sequences by its Entries (`decode`)."""
        if self.observer is not None:
            raise ValueError("a pass of several sequences beside an observer goes through decode")
        n = 0
        for seq, tokens, n_rows in runs:
            self.settle(seq)
            n = self._fill(n, seq, tokens, n_rows)
            self.unsettled.add(seq)
        self._batch.n_tokens = n
        self._run(self._batch)
        for seq, tokens, _ in runs:
            self.tokens[seq].extend(tokens)
            self.unsettled.discard(seq)

    def _fill(self, start: int, seq: int, tokens: Sequence[int], n_rows: int) -> int:
        """Sequence `seq`'s `tokens` into the batch from index `start`, after what `tokens[seq]` holds,
        rows of logits for the last `n_rows`; the batch's tokens with them."""
        token, pos, logits, seq_ids = self._token, self._pos, self._logits, self._seq_ids
        shift, first = len(self.tokens[seq]) - start, start + len(tokens) - n_rows  # index i: position i + shift
        for i, t in enumerate(tokens, start):
            token[i], pos[i], logits[i] = t, i + shift, i >= first
            seq_ids[i][0] = seq
        return start + len(tokens)

    def _run(self, batch) -> None:
        code = llama_cpp.llama_decode(self._ctx, batch)
        if code == 1:
            raise ContextFull(f"llama.cpp found no room in the KV cache of {self._name} (context full)")
        if code != 0:
            raise InferenceError(
                f"llama.cpp could not evaluate a batch of {batch.n_tokens} tokens (llama_decode: {code})"
            )

    def truncate(self, n_tokens: int, seq: int = 0) -> None:
        """Forget sequence `seq`'s cache entries from position `n_tokens` on (speculation rollback, a
        reused prefix). A window cache cut back past the cells it reused keeps nothing: `n_past` says
        what is kept.

        A recurrent or hybrid model's cache can only be emptied, not cut; llama.cpp says so by
        returning false, and going on would evaluate on top of tokens that were meant to be gone.
        """
        self.settle(seq)
        cached = self.tokens[seq]
        if n_tokens >= len(cached):
            return
        if n_tokens == 0:
            self.clear(seq)
            return
        if not llama_cpp.llama_memory_seq_rm(self._memory, seq, n_tokens, -1):
            raise InferenceError(
                f"llama.cpp cannot cut the cache of {self._name} back to {n_tokens} tokens "
                "(a recurrent or hybrid model): it cannot be used for speculative decoding"
            )
        del cached[n_tokens:]
        if self.observer is not None:
            self.observer.truncated(seq, n_tokens)
        if self._window and not self._window_whole(seq):
            self.clear(seq)  # callers evaluate what they lack

    def clear(self, seq: int) -> None:
        """Empty sequence `seq`'s cache (the others keep theirs)."""
        if len(self.tokens) == 1:
            llama_cpp.llama_memory_clear(self._memory, True)
        else:
            llama_cpp.llama_memory_seq_rm(self._memory, seq, -1, -1)
        self.tokens[seq].clear()
        self.unsettled.discard(seq)
        if self.observer is not None:
            self.observer.truncated(seq, 0)

    def save(self, seq: int) -> bytearray | memoryview:
        """Sequence `seq`'s cells, to restore later (engine/slots.py keeps prefixes in host RAM)."""
        self.settle(seq)
        return read_cells(self._ctx, seq, self.host)

    def expect_save(self, seq: int, most: int) -> None:
        """Sequence `seq` may be saved before it is used again, if it takes at most `most` bytes: have
        host memory that large touched for it (llama/host_memory.py)."""
        self.settle(seq)
        self.host.expect(seq, llama_cpp.llama_state_seq_get_size(self._ctx, seq), most)

    def drop_save(self, seq: int) -> None:
        """Sequence `seq` is used again as it is: no save of it to make memory ready for."""
        self.host.drop(seq)

    def restore(self, seq: int, state: bytes | bytearray | memoryview, tokens: Sequence[int]) -> bool:
        """Sequence `seq` as `save` gave it when it held `tokens`; False (and the sequence empty) when
        llama.cpp cannot take it back."""
        self.clear(seq)
        if not state:
            return False
        if not write_cells(self._ctx, seq, state):
            self.clear(seq)
            return False
        self.tokens[seq].extend(tokens)
        return True

    def settle(self, seq: int) -> None:
        """After a decode whose bookkeeping did not finish (Ctrl-C can land between llama_decode
        returning and `tokens` growing), make llama.cpp's cache hold exactly `tokens` again."""
        if seq not in self.unsettled:
            return
        if not llama_cpp.llama_memory_seq_rm(self._memory, seq, len(self.tokens[seq]), -1):
            self.clear(seq)  # a recurrent cache: start over
        self.unsettled.discard(seq)

    def _window_whole(self, seq: int) -> bool:
        """Does the window cache still hold every token the next position sees? Cut back past the
        cells it reused (a retry of a long answer), it does not (llama-server's pos_min check)."""
        oldest = llama_cpp.llama_memory_seq_pos_min(self._memory, seq)
        return 0 <= oldest <= max(0, len(self.tokens[seq]) - self._window)

    def close(self) -> None:
        self.host.close()
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None


def read_cells(ctx: llama_cpp.llama_context_p, seq: int, host: HostMemory | None = None) -> bytearray | memoryview:
    """Sequence `seq`'s cells in context `ctx`, as llama.cpp saves them (`write_cells` takes them back),
    in `host`'s memory where it has some touched (llama/host_memory.py). llama.cpp writes straight
    into the bytes kept, and `write_cells` reads them in place: a slot's prefix is tens of MB (53 MB
    for the demo target's 2,000 tokens), and each copy through a ctypes array of its own took 25-30 ms
    of the loop thread, with every slot's pass waiting."""
    size = llama_cpp.llama_state_seq_get_size(ctx, seq)
    state = host.take(size) if host is not None else bytearray(size)
    written = llama_cpp.llama_state_seq_get_data(ctx, _cells(state), size, seq)
    if isinstance(state, memoryview):
        return state[:written]
    del state[written:]
    return state


def write_cells(ctx: llama_cpp.llama_context_p, seq: int, state: bytes | bytearray | memoryview) -> bool:
    """`read_cells`'s bytes back into sequence `seq` of `ctx`; False where llama.cpp cannot take them."""
    return llama_cpp.llama_state_seq_set_data(ctx, _cells(state), len(state), seq) != 0


def _cells(state: bytes | bytearray | memoryview) -> ctypes.Array[ctypes.c_uint8]:
    """`state` as the byte array llama.cpp's state calls take: in place where it can be written, else a copy."""
    array_type = ctypes.c_uint8 * len(state)
    writable = isinstance(state, bytearray) or (isinstance(state, memoryview) and not state.readonly)
    return array_type.from_buffer(state) if writable else array_type.from_buffer_copy(state)
