"""The narrow seam to llama-cpp-python: load, evaluate a batch, read chosen logits, truncate KV.

Nothing else in ollama-spec touches llama.cpp. We use the low-level bindings rather than
`llama_cpp.Llama` because `Llama` keeps an n_batch x n_vocab score buffer (n_ctx x n_vocab with
a draft model) and can only ask for logits at the last position or at every position; the
speculative loop needs exactly the K+1 verify rows and nothing more.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp._internals import LlamaContext, LlamaModel

from ollama_spec.errors import ContextFull, InferenceError, InvalidSetting, ModelLoadError
from ollama_spec.llama.load_params import (  # noqa: F401 - extra_bufts_default: callers take it from here
    FLASH_ATTENTION,
    KV_TYPES,
    apply_lora_adapters,
    apply_placement,
    default_threads,
    extra_bufts_default,
    kv_override_array,
)
from ollama_spec.llama.log import is_verbose, last_error, log_mark
from ollama_spec.llama.passes import Entry, PassCosts, chunked, piece_size, plan_passes
from ollama_spec.llama.sequences import SequenceView
from ollama_spec.llama.tokenizing import Tokenizer
from ollama_spec.planning.placement import Placement

LLAMA_CPP_VERSION = llama_cpp.__version__  # part of cache keys: another build may time steps otherwise


@dataclass(frozen=True)
class LoadSettings:
    n_ctx: int = 4096
    n_gpu_layers: int = -1  # -1: every layer on the GPU when there is one
    n_threads: int | None = None
    n_batch: int = 512
    kv_overrides: tuple[tuple[str, str | int | float | bool], ...] = ()
    kv_type: str = "f16"  # KV cache element type: f16, q8_0 or q4_0 (quantized needs flash attention)
    # llama.cpp's extra CPU buffers (AMX, CPU_REPACK): a repacked second copy of CPU weights,
    # faster for some batch sizes, fatal on some machines (see canary.py).
    use_extra_bufts: bool = True
    # "auto" lets llama.cpp choose (it picks flash attention wherever the backend has it);
    # "off" can be faster for small verify batches deep into a context on a CPU.
    flash_attention: str = "auto"
    placement: Placement = Placement()  # RPC servers and GPU split; the default is this machine's GPUs
    # GGUF LoRA adapters applied at scale 1 over the weights, in order (Ollama's adapter layers,
    # which it passes to llama.cpp as --lora)
    lora_adapters: tuple[Path, ...] = ()
    # A sliding-window model's window layers cache only the window and a batch (the engine's
    # target, architectures.takes_window_cache), instead of every position (see `truncate`).
    window_cache: bool = False
    # Sequences in the cache, each of n_ctx tokens (serve's slots: requests that run together)
    n_seq: int = 1
    # With several sequences: a stream each and passes laid out so that a sequence's rows do not
    # depend on the others (passes.py), as a target's must, whose rows are the answer. Else one
    # unified cache and batches as they come (no padding), enough for a draft, whose rows only
    # choose what is proposed: the target's verdict on it is the same bits either way.
    isolated_rows: bool = True
    # Load the model's MTP (NextN) layers too, for a draft context over them (mtp.py); llama.cpp
    # skips them otherwise
    load_mtp: bool = False

    def __post_init__(self) -> None:
        if self.n_seq < 1:
            raise InvalidSetting(f"--parallel must be at least 1, got {self.n_seq}")


class LoadedModel:
    """One GGUF in llama.cpp with `settings.n_seq` sequences (0 unless told: what `eval`, `truncate`
    and `cached` mean without one); the caller tracks positions, we keep the cache."""

    def __init__(self, path: str | Path, settings: LoadSettings = LoadSettings()):
        self.path = Path(path)
        self.settings = settings
        mark = log_mark()
        model_params = llama_cpp.llama_model_default_params()
        model_params.n_gpu_layers = 0x7FFFFFFF if settings.n_gpu_layers < 0 else settings.n_gpu_layers
        model_params.use_extra_bufts = settings.use_extra_bufts
        model_params.load_mtp = settings.load_mtp
        self._placement_arrays = apply_placement(model_params, settings.placement)
        self._overrides = kv_override_array(settings.kv_overrides)
        if self._overrides is not None:
            model_params.kv_overrides = self._overrides
        try:
            self._model = LlamaModel(path_model=str(self.path), params=model_params, verbose=is_verbose())
        except ValueError as exc:
            raise ModelLoadError(f"llama.cpp could not load {self.path}: {last_error(mark) or exc}") from None
        threads = settings.n_threads or default_threads()
        ctx_params = llama_cpp.llama_context_default_params()
        # room for every sequence's n_ctx tokens; with isolated rows each in a stream of its own
        # (llama-server's -np N): in one unified cache a sequence's cells land wherever others left
        # room, and its rows' sums then depend on what other requests ran
        ctx_params.n_ctx = settings.n_ctx * settings.n_seq
        ctx_params.n_batch = settings.n_batch
        ctx_params.n_ubatch = settings.n_batch
        ctx_params.n_seq_max = settings.n_seq
        ctx_params.kv_unified = settings.n_seq > 1 and not settings.isolated_rows
        # A sliding-window model (Gemma, gpt-oss) with a window-sized cache reuses the cells of
        # tokens that no later token can see. A cache cut back past them would attend over a window
        # with holes: `truncate` then starts over, which a draft, cut back after every step, cannot
        # afford. So only a target asks for one; everything else keeps every position.
        ctx_params.swa_full = not settings.window_cache
        ctx_params.n_threads = threads
        ctx_params.n_threads_batch = threads
        ctx_params.no_perf = True
        ctx_params.type_k = ctx_params.type_v = KV_TYPES[settings.kv_type]
        ctx_params.flash_attn_type = FLASH_ATTENTION[settings.flash_attention]
        if settings.kv_type != "f16":  # llama.cpp quantizes the V cache only with flash attention
            if settings.flash_attention == "off":
                raise InvalidSetting(f"--kv-type {settings.kv_type} needs flash attention: drop --flash-attn off")
            ctx_params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        try:
            self._ctx = LlamaContext(model=self._model, params=ctx_params, verbose=is_verbose())
        except ValueError:
            self._model.close()
            raise ModelLoadError(
                f"llama.cpp could not create a {settings.n_ctx}-token context for {self.path}: "
                f"{last_error(mark) or 'out of memory?'}"
            ) from None
        try:  # the LoRA adapters' llama.cpp handles, which a second context on the same weights sets too
            self.adapters = apply_lora_adapters(
                self._model.model, self._ctx.ctx, settings.lora_adapters, mark, self.path.name
            )
        except ModelLoadError:
            self._ctx.close()
            self._model.close()
            raise
        self.llama_model = self._model  # for a second context on the same weights (embedding.py)
        self.vocab = self._model.vocab
        self.n_vocab = self._model.n_vocab()
        # llama.cpp rounds a context up (to 256 tokens at least): the cache has that room, but the
        # limit a user asked for with --ctx is the one generation keeps to and reports
        self.n_ctx = min(settings.n_ctx, self._ctx.n_ctx() // settings.n_seq)
        self.n_threads = threads
        # llama.cpp may clamp the batch to the context; chunks must respect what it chose.
        self.n_batch = llama_cpp.llama_n_batch(self._ctx.ctx)
        self._stream = self._ctx.n_ctx() // settings.n_seq  # positions each sequence's stream holds
        self._piece = piece_size(self.n_batch, settings.n_seq)
        # without flash attention, attention's own products over one row of a sequence take vec_dot
        self._min_rows = 2 if settings.flash_attention == "off" else 1
        self.pass_costs = PassCosts()  # what a pass more costs, for the passes' layout
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        # each sequence's token ids in the KV cache, in order: a next request may reuse them
        self._cached: list[list[int]] = [[] for _ in range(settings.n_seq)]
        self._window = llama_cpp.llama_model_n_swa(self._model.model) if settings.window_cache else 0
        self._unsettled: set[int] = set()  # sequences a decode ran on whose tokens `cached` may not hold yet
        # An EAGLE-3 head beside this target (llama/eagle3.py): told of every pass and every cut
        self.observer = None
        self.busy_seconds = 0.0  # time inside llama.cpp's decode and logits copies: the rest is our loop
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._tokenizer = Tokenizer(self._model)

    @property
    def llama_context(self):
        """llama.cpp's context (for a head that reads this target's captured rows: llama/eagle3.py)."""
        return self._ctx.ctx

    # --- text <-> tokens -------------------------------------------------------------------
    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        return self._tokenizer.tokenize(text, add_bos=add_bos, special=special)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The token's text as raw bytes (a piece may hold part of a UTF-8 character).

        Control tokens (`<|eot_id|>`, `<|im_start|>`) render as nothing unless `special`.
        """
        piece = self._pieces.get((token, special))
        if piece is None:
            size = 64
            while True:
                buf = ctypes.create_string_buffer(size)
                n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, size, 0, special)
                if n >= 0:
                    break
                size = -n
            piece = self._pieces[(token, special)] = buf.raw[:n]
        return piece

    def token_piece(self, token: int) -> tuple[bytes, bool]:
        """The token's bytes and whether they are a special token's text (`<|eot_id|>`)."""
        piece = self.token_bytes(token)
        if piece:
            return piece, False
        special = self.token_bytes(token, special=True)
        return special, bool(special)

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return self._model.detokenize(list(tokens), special=special).decode("utf-8", errors="replace")

    def fill_in_the_middle_tokens(self) -> tuple[int, int, int] | None:
        """The vocabulary's prefix, suffix and middle markers (code models: Qwen2.5-Coder, CodeLlama,
        StarCoder2), or None when it has none."""
        ids = (
            llama_cpp.llama_vocab_fim_pre(self.vocab),
            llama_cpp.llama_vocab_fim_suf(self.vocab),
            llama_cpp.llama_vocab_fim_mid(self.vocab),
        )
        return None if min(ids) < 0 else ids

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    @property
    def add_bos(self) -> bool:
        return self._model.add_bos_token()

    @property
    def bos_token(self) -> int:
        return self._model.token_bos()

    @property
    def eos_token(self) -> int:
        return self._model.token_eos()

    # --- evaluation ------------------------------------------------------------------------
    @property
    def cached(self) -> list[int]:
        """Sequence 0's tokens in the KV cache."""
        return self._cached[0]

    @cached.setter
    def cached(self, tokens: list[int]) -> None:  # the record only: for tests that break it on purpose
        self._cached[0] = tokens

    @property
    def n_past(self) -> int:
        """Tokens currently in sequence 0's cache."""
        return len(self._cached[0])

    @property
    def n_seq(self) -> int:
        return len(self._cached)

    def cached_of(self, seq: int) -> list[int]:
        return self._cached[seq]

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
        started = time.perf_counter()
        passes = self._passes(items)
        rows: list[list[np.ndarray]] = [[] for _ in items]
        for entries in passes:
            begun = time.perf_counter()
            self._decode(entries)
            self.pass_costs.observe(len(entries), time.perf_counter() - begun)
            wanted = [entry for entry in entries if entry.logits]
            if wanted:
                for row, entry in zip(self._read_logits(len(wanted)), wanted):
                    if entry.row:
                        rows[entry.item].append(row)
        self.busy_seconds += time.perf_counter() - started
        return [np.stack(item_rows) for item_rows in rows]

    def _passes(self, items: Sequence[tuple[int, Sequence[int], int]]) -> list[list[Entry]]:
        """With several sequences, passes whose rows each get the kernels they get alone (passes.py);
        else (one sequence, or no room left for padding at a context's end) n_batch chunks as they come."""
        if self.n_seq > 1 and self.settings.isolated_rows:
            room = lambda seq: self._stream - len(self._cached[seq])
            pass_rows = self.pass_costs.pass_rows
            planned = plan_passes(items, self._piece, room, self.n_batch, pass_rows=pass_rows, min_rows=self._min_rows)
            if planned is not None:
                return planned
        return chunked(items, self.n_batch)

    def truncate(self, n_tokens: int, seq: int = 0) -> None:
        """Forget sequence `seq`'s cache entries from position `n_tokens` on (speculation rollback, a
        reused prefix). A window cache cut back past the cells it reused keeps nothing: `n_past` says
        what is kept.

        A recurrent or hybrid model's cache can only be emptied, not cut; llama.cpp says so by
        returning false, and going on would evaluate on top of tokens that were meant to be gone.
        """
        self._settle(seq)
        cached = self._cached[seq]
        if n_tokens >= len(cached):
            return
        if n_tokens == 0:
            self.clear_sequence(seq)
            return
        if not llama_cpp.llama_memory_seq_rm(self._ctx.memory, seq, n_tokens, -1):
            raise InferenceError(
                f"llama.cpp cannot cut the cache of {self.path.name} back to {n_tokens} tokens "
                "(a recurrent or hybrid model): it cannot be used for speculative decoding"
            )
        del cached[n_tokens:]
        if self.observer is not None:
            self.observer.truncated(seq, n_tokens)
        if self._window and not self._window_whole(seq):
            self.clear_sequence(seq)  # callers evaluate what they lack

    def clear_sequence(self, seq: int) -> None:
        """Empty sequence `seq`'s cache (the others keep theirs)."""
        if self.n_seq == 1:
            llama_cpp.llama_memory_clear(self._ctx.memory, True)
        else:
            llama_cpp.llama_memory_seq_rm(self._ctx.memory, seq, -1, -1)
        self._cached[seq].clear()
        self._unsettled.discard(seq)
        if self.observer is not None:
            self.observer.truncated(seq, 0)

    def save_sequence(self, seq: int) -> bytes:
        """Sequence `seq`'s cells, to restore later (engine/slots.py keeps prefixes in host RAM)."""
        self._settle(seq)
        size = llama_cpp.llama_state_seq_get_size(self._ctx.ctx, seq)
        buffer = (ctypes.c_uint8 * size)()
        written = llama_cpp.llama_state_seq_get_data(self._ctx.ctx, buffer, size, seq)
        return ctypes.string_at(buffer, written)  # slicing the array would build a list of ints: 55 ms for 4 MB

    def restore_sequence(self, seq: int, state: bytes, tokens: Sequence[int]) -> bool:
        """Sequence `seq` as `save_sequence` gave it when it held `tokens`; False (and the sequence
        empty) when llama.cpp cannot take it back."""
        self.clear_sequence(seq)
        if not state:
            return False
        buffer = (ctypes.c_uint8 * len(state)).from_buffer_copy(state)
        if llama_cpp.llama_state_seq_set_data(self._ctx.ctx, buffer, len(state), seq) == 0:
            self.clear_sequence(seq)
            return False
        self._cached[seq].extend(tokens)
        return True

    def _window_whole(self, seq: int) -> bool:
        """Does the window cache still hold every token the next position sees? Cut back past the
        cells it reused (a retry of a long answer), it does not (llama-server's pos_min check)."""
        oldest = llama_cpp.llama_memory_seq_pos_min(self._ctx.memory, seq)
        return 0 <= oldest <= max(0, len(self._cached[seq]) - self._window)

    def _settle(self, seq: int) -> None:
        """After a decode whose bookkeeping did not finish (Ctrl-C can land between llama_decode
        returning and `cached` growing), make llama.cpp's cache hold exactly `cached` again."""
        if seq not in self._unsettled:
            return
        if not llama_cpp.llama_memory_seq_rm(self._ctx.memory, seq, len(self._cached[seq]), -1):
            self.clear_sequence(seq)  # a recurrent cache: start over
        self._unsettled.discard(seq)

    def _decode(self, entries: Sequence[Entry]) -> None:
        """One llama_decode of `entries`, each after what its sequence holds; padding is cut off after."""
        seqs = {entry.seq for entry in entries}
        for seq in seqs:
            self._settle(seq)
        batch, next_pos = self._batch, {seq: len(self._cached[seq]) for seq in seqs}
        batch.n_tokens = len(entries)
        for i, entry in enumerate(entries):
            batch.token[i] = entry.token
            batch.pos[i] = next_pos[entry.seq]
            next_pos[entry.seq] += 1
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = entry.seq
            batch.logits[i] = entry.logits
        self._unsettled |= seqs  # until `cached` says what llama.cpp holds now
        code = llama_cpp.llama_decode(self._ctx.ctx, batch)
        if code == 1:
            raise ContextFull(f"llama.cpp found no room in the KV cache of {self.path.name} (context full)")
        if code != 0:
            raise InferenceError(
                f"llama.cpp could not evaluate a batch of {len(entries)} tokens (llama_decode: {code})"
            )
        positions = [batch.pos[i] for i in range(len(entries))] if self.observer is not None else []
        for seq in seqs:
            self._cached[seq].extend(entry.token for entry in entries if entry.seq == seq and entry.item is not None)
            if next_pos[seq] > len(self._cached[seq]):  # padding: gone again before anything reads the cache
                llama_cpp.llama_memory_seq_rm(self._ctx.memory, seq, len(self._cached[seq]), -1)
        self._unsettled -= seqs
        if self.observer is not None:  # the head reads this pass's captured rows before the next pass
            self.observer.passed(entries, positions)

    def _read_logits(self, n_rows: int) -> np.ndarray:
        ptr = llama_cpp.llama_get_logits(self._ctx.ctx)
        return np.ctypeslib.as_array(ptr, shape=(n_rows, self.n_vocab)).copy()

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self._ctx.close()
        for adapter in self.adapters:
            llama_cpp.llama_adapter_lora_free(adapter)
        self.adapters = []
        self._model.close()

    def __enter__(self) -> LoadedModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
