"""The narrow seam to llama-cpp-python: load, evaluate a batch, read chosen logits, truncate KV.

Nothing else in ollama-spec touches llama.cpp. We use the low-level bindings rather than
`llama_cpp.Llama` because `Llama` keeps an n_batch x n_vocab score buffer (n_ctx x n_vocab with
a draft model) and can only ask for logits at the last position or at every position; the
speculative loop needs exactly the K+1 verify rows and nothing more.

A LoadedModel is made of one object per job: `loading.open_model` (weights with their adapters, a context),
`vocabulary.Vocabulary` (text <-> tokens), `kv_cache.SequenceCache` (what each sequence holds, the
passes that append to it and the cuts); this module lays evaluations out in passes and reads their
logits.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path
from time import perf_counter

import llama_cpp
import numpy as np

from ollama_spec.errors import ContextFull
from ollama_spec.llama.kv_cache import SequenceCache
from ollama_spec.llama.loading import LoadSettings, Weights, open_model
from ollama_spec.llama.passes import Entry, PassCosts, chunked, piece_size, plan_passes
from ollama_spec.llama.sequences import SequenceView
from ollama_spec.llama.vocabulary import Vocabulary

__all__ = ["LLAMA_CPP_VERSION", "LoadSettings", "LoadedModel", "Weights"]

LLAMA_CPP_VERSION = llama_cpp.__version__  # part of cache keys: another build may time steps otherwise


class LoadedModel:
    """One GGUF in llama.cpp with `settings.n_seq` sequences (0 unless told: what `eval`, `truncate`
    and `cached` mean without one); the caller tracks positions, we keep the cache.

    The text side (`tokenize`, `token_piece`, `detokenize`, ...) is the Vocabulary's, the cache's
    (`truncate`, `clear_sequence`, `save_sequence`, `restore_sequence`, ...) the SequenceCache's: their
    methods are bound here once, so a call costs what a method of this class would.
    """

    def __init__(
        self,
        path: str | Path,
        settings: LoadSettings = LoadSettings(),
        weights: Weights | None = None,
        *,
        borrowed: bool = False,
    ):
        """Load `path` with `settings`; or a context over `weights` loaded before with the same settings,
        which it then owns as its own (`borrowed`: `close` leaves them open, for another context)."""
        self.path = Path(path)
        self.settings = settings
        opened = open_model(self.path, settings, weights)
        self.weights, self._ctx = opened.weights, opened.ctx
        self._model, self.adapters = opened.weights.model, opened.weights.adapters
        self.borrowed = borrowed
        self.llama_model = self._model  # for a second context on the same weights (embedding.py)
        self.n_vocab = self._model.n_vocab()
        # llama.cpp rounds a context up (to 256 tokens at least): the cache has that room, but the
        # limit a user asked for with --ctx is the one generation keeps to and reports
        self.n_ctx = min(settings.n_ctx, self._ctx.n_ctx() // settings.n_seq)
        self.n_threads = opened.threads
        # llama.cpp may clamp the batch to the context; chunks must respect what it chose.
        self.n_batch = llama_cpp.llama_n_batch(self._ctx.ctx)
        self.n_seq = settings.n_seq
        self._stream = self._ctx.n_ctx() // settings.n_seq  # positions each sequence's stream holds
        # passes laid out by plan_passes: with several streams, llama.cpp takes a pass whole only where
        # its sequences are consecutive with equally many tokens each
        self._plans = settings.n_seq > 1
        self._exact = self._plans and settings.isolated_rows  # each row computed as it is alone (passes.py)
        self._piece = piece_size(self.n_batch, settings.n_seq, self._exact)
        # without flash attention, attention's own products over one row of a sequence take vec_dot
        self._min_rows = 2 if settings.flash_attention == "off" and self._exact else 1
        self.pass_costs = PassCosts()  # what a pass more costs, for the passes' layout
        self.busy_seconds = 0.0  # time inside llama.cpp's decode and logits copies: the rest is our loop
        self._logits_at, self._logits = 0, np.empty((0, 0), np.float32)  # llama.cpp's logits, viewed (_read_logits)
        self._bind_vocabulary(Vocabulary(self._model))
        window = llama_cpp.llama_model_n_swa(self._model.model) if settings.window_cache else 0
        self._bind_cache(SequenceCache(self._ctx, settings.n_seq, self.n_batch, window, self.path.name))

    def _bind_vocabulary(self, vocabulary: Vocabulary) -> None:
        self.vocab = vocabulary.vocab
        self.add_bos, self.bos_token, self.eos_token = vocabulary.add_bos, vocabulary.bos_token, vocabulary.eos_token
        self.tokenize = vocabulary.tokenize
        self.token_bytes = vocabulary.token_bytes
        self.token_piece = vocabulary.token_piece
        self.detokenize = vocabulary.detokenize
        self.fill_in_the_middle_tokens = vocabulary.fill_in_the_middle_tokens
        self.is_end_of_generation = vocabulary.is_end_of_generation

    def _bind_cache(self, cache: SequenceCache) -> None:
        self._cache = cache
        self._cached = cache.tokens  # each sequence's token ids in the KV cache, in order
        self._decode, self._decode_tokens = cache.decode, cache.decode_tokens
        self.truncate = cache.truncate
        self.clear_sequence = cache.clear
        self.save_sequence = cache.save
        self.expect_save, self.drop_save = cache.expect_save, cache.drop_save
        self.restore_sequence = cache.restore
        self.cached_of = cache.tokens.__getitem__  # sequence i's token ids

    @property
    def observer(self):
        """An EAGLE-3 head beside this target (llama/eagle3.py): told of every pass and every cut."""
        return self._cache.observer

    @observer.setter
    def observer(self, observer) -> None:
        self._cache.observer = observer

    @property
    def llama_context(self):
        """llama.cpp's context (for a head that reads this target's captured rows: llama/eagle3.py)."""
        return self._ctx.ctx

    @property
    def cached(self) -> list[int]:
        """Sequence 0's tokens in the KV cache."""
        return self._cached[0]

    @cached.setter
    def cached(self, tokens: list[int]) -> None:  # the record only: for tests that break it on purpose
        self._cached[0] = tokens

    @property
    def min_width(self) -> int:
        """Tokens each sequence of a pass beside others brings at least, padding made up (passes.py):
        a pass of n sequences of one token each costs what one of n × min_width tokens does."""
        return self._min_rows

    @property
    def n_past(self) -> int:
        """Tokens currently in sequence 0's cache."""
        return len(self._cached[0])

    def sequence(self, seq: int) -> SequenceView:
        """Sequence `seq` as the draft/verify loop sees a model (a slot's view)."""
        return SequenceView(self, seq)

    def eval(self, tokens: Sequence[int], *, logits: str | int = "last", seq: int = 0) -> np.ndarray:
        """Append `tokens` to sequence `seq`; return logits rows: `last` (1 x V), `all` (n x V), or a
        number m: the last m rows (m x V), as a verify batch that also reads the end of a prompt needs.

        Long inputs are split into n_batch chunks with logits only where asked for.
        """
        return self.decode_many([(seq, tokens, self.rows_asked(tokens, logits, seq))])[0]

    def rows_asked(self, tokens: Sequence[int], logits: str | int, seq: int = 0) -> int:
        """How many rows `logits` asks for; ValueError or ContextFull for what cannot be evaluated."""
        if not tokens:
            raise ValueError("eval needs at least one token")
        n_rows = len(tokens) if logits == "all" else 1 if logits == "last" else logits
        if not isinstance(n_rows, int) or not 1 <= n_rows <= len(tokens):
            raise ValueError(f"eval returns 'last', 'all' or 1..{len(tokens)} rows, not {logits!r}")
        if len(self._cached[seq]) + len(tokens) > self.n_ctx:
            raise ContextFull(f"the context is full ({self.n_ctx} tokens); raise --ctx or shorten the prompt")
        return n_rows

    def decode_many(self, items: Sequence[tuple[int, Sequence[int], int]]) -> list[np.ndarray]:
        """For each (sequence, tokens, rows): the tokens appended to that sequence, and the logits of
        its last `rows` tokens, in the passes `_passes` lays out (one llama_decode each)."""
        started = perf_counter()
        if len(items) == 1 and (self._laid_out_alone(items[0]) if self._exact else len(items[0][1]) <= self.n_batch):
            seq, tokens, n_rows = items[0]  # one pass as it comes: a lone step's, most passes of all
            self._decode_tokens(seq, tokens, n_rows)
            if self._exact:  # a draft's, mostly one token each: its laid-out passes fit it
                self.pass_costs.observe(len(tokens), perf_counter() - started)
            read = self._read_logits(n_rows)
            self.busy_seconds += perf_counter() - started
            return [read]
        rows: list[list[tuple[np.ndarray, int]]] = [[] for _ in items]  # each item's: (a pass's rows, which)
        for entries in self._passes(items):
            begun = perf_counter()
            self._decode(entries)
            if self._plans:  # what a pass costs lays out the next passes (`_passes`); else unused
                self.pass_costs.observe(len(entries), perf_counter() - begun)
            wanted = [entry for entry in entries if entry.logits]
            if wanted:
                read = self._read_logits(len(wanted))
                for index, entry in enumerate(wanted):
                    if entry.row:
                        rows[entry.item].append((read, index))
        self.busy_seconds += perf_counter() - started
        return [_together(item_rows) for item_rows in rows]

    def _laid_out_alone(self, item: tuple[int, Sequence[int], int]) -> bool:
        """Whether plan_passes lays one sequence's (seq, tokens, rows) out as one pass as it comes: a
        piece at most, without padding, and not one row of logits (which it widens)."""
        n = len(item[1])
        return max(self._min_rows, 2) <= n <= min(self._piece, self.n_batch) and item[2] >= 2

    def _passes(self, items: Sequence[tuple[int, Sequence[int], int]]) -> list[list[Entry]]:
        """With several sequences, passes llama.cpp takes whole (passes.py), whose rows each get the
        kernels they get alone where rows are exact; else (one sequence, a draft's side-by-side rows, or
        no room left for padding at a context's end) n_batch chunks as they come."""
        if self._plans and (self._exact or not _side_by_side(items, self.n_batch)):
            room = lambda seq: self._stream - len(self._cached[seq])
            pass_rows = self.pass_costs.pass_rows
            planned = plan_passes(
                items, self._piece, room, self.n_batch, pass_rows=pass_rows, min_rows=self._min_rows, exact=self._exact
            )
            if planned is not None:
                return planned
        return chunked(items, self.n_batch)

    def _read_logits(self, n_rows: int) -> np.ndarray:
        """A copy of the last pass's `n_rows` rows of logits, read through a view of llama.cpp's
        buffer made once for each place it has (a pass never has more rows than n_batch): a third of
        the time of np.ctypeslib.as_array on the pointer every pass."""
        at = ctypes.addressof(llama_cpp.llama_get_logits(self._ctx.ctx).contents)
        if at != self._logits_at:
            rows = (ctypes.c_float * (self.n_batch * self.n_vocab)).from_address(at)
            self._logits = np.frombuffer(rows, dtype=np.float32).reshape(self.n_batch, self.n_vocab)
            self._logits_at = at
        return self._logits[:n_rows].copy()

    def close(self) -> None:
        self._cache.close()
        self._ctx.close()
        if not self.borrowed:
            self.weights.close()
        self.adapters = []

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _side_by_side(items: Sequence[tuple[int, Sequence[int], int]], n_batch: int) -> bool:
    """Whether llama.cpp takes the items as they come without a pass more than their n_batch chunks:
    one sequence's, or consecutive sequences in order with equally many tokens each, n_batch in all
    (a draft's step across its slots: one token each)."""
    first, width = items[0][0], len(items[0][1])
    if len(items) == 1:
        return True
    return width * len(items) <= n_batch and all(
        seq == first + i and len(tokens) == width for i, (seq, tokens, _) in enumerate(items)
    )


def _together(rows: list[tuple[np.ndarray, int]]) -> np.ndarray:
    """An item's rows as one array: the slice of a pass's rows where they lie together there (every
    item of a step's pass, as a rule), else copied together."""
    read, first = rows[0]
    if rows[-1][0] is read and rows[-1][1] - first == len(rows) - 1:
        return read[first : first + len(rows)]
    return np.stack([read[index] for read, index in rows])
