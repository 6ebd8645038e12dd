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
from itertools import accumulate
from pathlib import Path
from time import perf_counter

import llama_cpp
import numpy as np

from ollama_spec.errors import ContextFull
from ollama_spec.llama.kv_cache import SequenceCache
from ollama_spec.llama.loading import LoadSettings, Weights, open_model
from ollama_spec.llama.pass_layout import PassLayout
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
        self.busy_seconds = 0.0  # time inside llama.cpp's decode and logits copies: the rest is our loop
        self._logits_at, self._logits = 0, np.empty((0, 0), np.float32)  # llama.cpp's logits, viewed (_read_logits)
        self._bind_vocabulary(Vocabulary(self._model))
        window = llama_cpp.llama_model_n_swa(self._model.model) if settings.window_cache else 0
        self._bind_cache(SequenceCache(self._ctx, settings.n_seq, self.n_batch, window, self.path.name))
        stream = self._ctx.n_ctx() // settings.n_seq  # positions each sequence's stream holds
        flash_off = settings.flash_attention == "off"
        self._layout = PassLayout(  # which passes an evaluation takes, and what a pass more costs
            self.n_batch, settings.n_seq, stream, self._cached, exact=settings.isolated_rows, flash_off=flash_off
        )

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
        self._decode, self._decode_tokens, self._decode_runs = cache.decode, cache.decode_tokens, cache.decode_runs
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
        return self._layout.min_rows

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
        its last `rows` tokens, in the passes its layout takes (one llama_decode each: pass_layout.py)."""
        started, layout = perf_counter(), self._layout
        if len(items) == 1 and layout.alone(items[0]):
            seq, tokens, n_rows = items[0]  # one pass as it comes: a lone step's, most passes of all
            self._decode_tokens(seq, tokens, n_rows)
            if layout.exact:  # a draft's, mostly one token each: its laid-out passes fit it
                layout.pass_costs.observe(len(tokens), perf_counter() - started)
            read = self._read_logits(n_rows)
            self.busy_seconds += perf_counter() - started
            return [read]
        if self._cache.observer is None and layout.whole(items):  # a head reads a pass by its Entries
            return self._decode_whole(items, started)  # several slots' pass as they come: a step's, as a rule
        rows: list[list[tuple[np.ndarray, int]]] = [[] for _ in items]  # each item's: (a pass's rows, which)
        for entries in layout.passes(items):
            begun = perf_counter()
            self._decode(entries)
            if layout.plans:  # what a pass costs lays out the next passes; else unused
                layout.pass_costs.observe(len(entries), perf_counter() - begun)
            wanted = [entry for entry in entries if entry.logits]
            if wanted:
                read = self._read_logits(len(wanted))
                for index, entry in enumerate(wanted):
                    if entry.row:
                        rows[entry.item].append((read, index))
        self.busy_seconds += perf_counter() - started
        return [_together(item_rows) for item_rows in rows]

    def _decode_whole(self, items: Sequence[tuple[int, Sequence[int], int]], started: float) -> list[np.ndarray]:
        """decode_many's one pass of several sequences' tokens as they come (PassLayout.whole), without
        an Entry a token: each item's rows a slice of the pass's."""
        self._decode_runs(items)
        self._layout.pass_costs.observe(sum([len(tokens) for _, tokens, _ in items]), perf_counter() - started)
        ends = list(accumulate([n_rows for _, _, n_rows in items]))
        read = self._read_logits(ends[-1])
        self.busy_seconds += perf_counter() - started
        return [read[end - n_rows : end] for end, (_, _, n_rows) in zip(ends, items)]

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


def _together(rows: list[tuple[np.ndarray, int]]) -> np.ndarray:
    """An item's rows as one array: the slice of a pass's rows where they lie together there (every
    item of a step's pass, as a rule), else copied together."""
    read, first = rows[0]
    if rows[-1][0] is read and rows[-1][1] - first == len(rows) - 1:
        return read[first : first + len(rows)]
    return np.stack([read[index] for read, index in rows])
