"""The passes of an EAGLE-3 head's own context: its encoder (the target's captured rows into g) and
its decoder ((token, g) pairs into its cache, with logits and pre-norm states where asked), with the
rows in and out through reused buffers (`RowIO`) and the batch built by calls that keep the GIL."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property

import llama_cpp
import numpy as np

from ollama_spec.errors import InferenceError
from ollama_spec.llama.head_calls import quick_calls
from ollama_spec.llama.head_rows import RowIO

# The most rows of a draft step's pass that also decodes the pairs the last target pass left waiting:
# every row of it is an output (see Eagle3Head.decode_many), n_vocab floats each (32 MB at 64 rows of 128k).
MERGED_ROWS = 64


class HeadPasses:
    """The encoder and decoder passes of Eagle3Head (which sets `_ctx`, `_batch`, `_state`, `calls`,
    `target`, `layers`, `n_embd`, `n_batch`, ...): kept apart so the head's file is about following the
    target and drafting."""

    # The rows in and out of the head's passes (built on first use: MtpHead sets up without __init__)
    @cached_property
    def _g_io(self) -> RowIO:
        """The decoder's g rows in; the target's captured rows and the head's outputs out."""
        return RowIO(self.n_embd, MERGED_ROWS)

    @cached_property
    def _features_io(self) -> RowIO:
        """The encoder's rows in: the three layers' captured rows side by side."""
        return RowIO(len(self.layers) * self.n_target_embd, MERGED_ROWS)

    @cached_property
    def _memory(self):
        return llama_cpp.llama_get_memory(self._ctx.ctx)

    @cached_property
    def _quick(self):
        return quick_calls()

    @cached_property
    def _captures(self) -> list[tuple]:
        """For each layer the head reads: the call giving the address of the target's captured rows,
        and its arguments."""
        tgt = self.target.llama_context
        calls = self.calls
        return [
            (calls.layer_inp_at, (tgt, layer)) if layer < self.target_layers else (calls.nextn_at, (tgt,))
            for layer in self.layers
        ]

    def _features(self, n_entries: int, rows: slice | list[int]) -> np.ndarray:
        """The captured rows `rows` of a pass of `n_entries`: the three layers' inputs side by side."""
        width, view, parts = self.n_target_embd, self._g_io.view, []
        for layer, (at, args) in zip(self.layers, self._captures):
            captured = view(at(*args), n_entries, width)
            if captured is None:
                raise InferenceError(f"the target captured no input of layer {layer} for the EAGLE-3 head")
            parts.append(captured[rows])
        return np.concatenate(parts, axis=1)

    def _encode(self, features: np.ndarray) -> np.ndarray:
        """g for each row of `features` (the encoder: fc, with its norm where the head has one)."""
        out = None if len(features) <= self.n_batch else np.empty((len(features), self.n_embd), dtype=np.float32)
        batch, io, quick = self._batch, self._features_io, self._quick
        add_embd, set_pos, set_output = quick.add_embd, quick.set_pos, quick.set_output_embd
        pos, pos_ref = io.pos, io.pos_ref
        for start in range(0, len(features), self.n_batch):
            chunk = features[start : start + self.n_batch]
            quick.batch_clear(batch)
            # the encoder reads no positions, but a batch's must follow what sequence 0 holds
            after = quick.seq_pos_max(self._memory, 0) + 1
            embds = io.embds(chunk)
            for j in range(len(chunk)):
                idx = add_embd(batch, 0, embds[j])
                pos.value = after + j
                set_pos(batch, idx, pos_ref)
                set_output(batch, idx, True)
            self._process(llama_cpp.LLAMA_PROCESS_TYPE_ENCODE, len(chunk))
            g = self._g_io.view(self.calls.nextn_at(self._ctx.ctx), len(chunk), self.n_embd)
            if g is None:
                raise InferenceError("the EAGLE-3 head's encoder gave no rows")
            if out is None:  # one pass: its rows, copied out of llama.cpp's buffer
                return g.copy()
            out[start : start + len(chunk)] = g
        return out

    def _decode(self, pairs: Sequence[tuple[int, int, int, np.ndarray]], *, outputs: bool = False) -> None:
        """One decoder pass over (seq, position, token, g) pairs; with `outputs`, logits and
        pre-norm states for every pair."""
        batch, quick, io, states = self._batch, self._quick, self._g_io, self._state
        add_token, set_pos, set_embd, set_output = (
            quick.add_token,
            quick.set_pos,
            quick.set_embd_token,
            quick.set_output_logits,
        )
        pos, pos_ref = io.pos, io.pos_ref
        quick.batch_clear(batch)
        embds = io.embds([pair[3] for pair in pairs])
        for i, (seq, position, token, _) in enumerate(pairs):
            idx = add_token(batch, seq, token)
            pos.value = position
            set_pos(batch, idx, pos_ref)
            set_embd(batch, idx, embds[i])
            if outputs:
                set_output(batch, idx, True)
            state = states[seq]
            if position >= state.end:
                state.end = position + 1
        self._process(llama_cpp.LLAMA_PROCESS_TYPE_DECODE, len(pairs))

    def _process(self, kind: int, n: int) -> None:
        code = llama_cpp.llama_process(self._ctx.ctx, kind, self._batch)
        if code != 0:
            stage = "encoder" if kind == llama_cpp.LLAMA_PROCESS_TYPE_ENCODE else "decoder"
            raise InferenceError(
                f"llama.cpp could not run the EAGLE-3 head's {stage} on {n} rows (llama_process: {code})"
            )
