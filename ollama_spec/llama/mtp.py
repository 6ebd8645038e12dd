"""MTP: a target's own NextN layer drafting for it, in an MTP context over the target's model.

The protocol is an EAGLE-3 head's (eagle3.py): at memory position P the NextN layer reads
(t[P+1], h[P]), where h is the target's final pre-norm state instead of an encoder's g, and each
draft step's own pre-norm state is the next step's h. So `MtpHead` is an `Eagle3Head` without a
model of its own or an encoder: the target, loaded with its NextN tensors (`LoadSettings.load_mtp`),
keeps h for every row it reads, and the MTP context (`LLAMA_CONTEXT_TYPE_MTP`, `ctx_other` = the
target's) holds the NextN layer's own cache, cut back with the target's.

The NextN layer follows the target lazily: the pairs a target pass completes wait (their h kept)
until a draft step reads the layer's cache, or a batch of them has gathered, and are then decoded in
one pass. So a step that does not draft (-k auto's K=0) costs the target alone plus a copy of h,
and a target with NextN layers can draft with them by default: they cost little where they do not pay.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import llama_cpp
import numpy as np

from ollama_spec.errors import InferenceError, ModelLoadError
from ollama_spec.llama.eagle3 import Eagle3Head, HeadSettings, _Sequence
from ollama_spec.llama.head_calls import head_calls
from ollama_spec.llama.log import log_mark


def nextn_layers(target) -> int:
    """How many NextN layers the loaded target (llama.model.LoadedModel) carries."""
    return int(llama_cpp.llama_model_n_layer_nextn(target.llama_model.model))


class MtpHead(Eagle3Head):
    """The NextN layer of `target` (a LoadedModel loaded with load_mtp) drafting beside it."""

    CONTEXT_TYPE = llama_cpp.LLAMA_CONTEXT_TYPE_MTP  # the target's NextN layer, in a context of its own
    CONTEXT_NAME = "an MTP context for"

    def __init__(self, target, *, n_gpu_layers: int = -1):
        self.calls = head_calls()
        self.path, self.target = target.path, target
        self.settings = HeadSettings(n_gpu_layers)
        if nextn_layers(target) < 1:
            raise ModelLoadError(f"{target.path} has no MTP (NextN) layers to draft with")
        self._model = target.llama_model  # shared: the target closes it
        mark = log_mark()
        self._ctx = self._context(mark)
        self.n_embd = self.n_target_embd = llama_cpp.llama_model_n_embd(self._model.model)
        self._zero = np.zeros(self.n_embd, dtype=np.float32)
        self.n_vocab = target.n_vocab
        self.n_batch = llama_cpp.llama_n_ubatch(self._ctx.ctx)
        self._batch = llama_cpp.llama_batch_ext_init(self._ctx.ctx)
        self._state = [_Sequence() for _ in range(target.n_seq)]
        self._lock = threading.RLock()
        self._waiting: list[tuple[int, int, int, np.ndarray]] = []  # (seq, position, token, h), not decoded yet
        self.calls.set_nextn(self._ctx.ctx, True, True)  # each draft step's own pre-norm state
        self.calls.set_nextn(target.llama_context, True, False)  # the target's h, every row
        target.observer = self

    def _features(self, n_entries: int, rows: slice | list[int]) -> np.ndarray:
        """The target's pre-norm state h of entries `rows`."""
        ptr = self.calls.get_nextn(self.target.llama_context)
        if not ptr:
            raise InferenceError("the target kept no pre-norm state for its MTP layer")
        h = np.ctypeslib.as_array(ptr, shape=(n_entries, self.n_embd))[rows]
        return np.ascontiguousarray(h, dtype=np.float32)

    def _encode(self, features: np.ndarray) -> np.ndarray:
        return features  # the NextN layer reads h as it is

    # The pairs that follow the target wait; anything that reads the layer's cache (a pass with outputs:
    # a draft step) decodes them first, in position order, and a cut drops those it cuts off.
    def _decode_all(self, pairs: Sequence[tuple[int, int, int, np.ndarray]]) -> None:
        for seq, position, _, _ in pairs:
            state = self._state[seq]
            state.end = max(state.end, position + 1)  # held, as far as the target's cuts and gaps go
        self._waiting += pairs
        if len(self._waiting) >= self.n_batch:
            self._catch_up()

    def _decode(self, pairs: Sequence[tuple[int, int, int, np.ndarray]], *, outputs: bool = False) -> None:
        if outputs:
            self._catch_up()
        super()._decode(pairs, outputs=outputs)

    def _cut(self, seq: int, position: int) -> None:
        self._waiting = [pair for pair in self._waiting if pair[0] != seq or pair[1] < position]
        super()._cut(seq, position)

    def save_state(self, seq: int) -> bytes:
        with self._lock:
            self._catch_up()  # the cells a slot's saved prefix keeps hold every pair its state says they do
            return super().save_state(seq)

    def _catch_up(self) -> None:
        waiting, self._waiting = self._waiting, []
        for start in range(0, len(waiting), self.n_batch):
            super()._decode(waiting[start : start + self.n_batch], outputs=False)

    def close(self) -> None:
        if getattr(self.target, "observer", None) is self:
            self.target.observer = None
            self.calls.set_nextn(self.target.llama_context, False, False)  # the target keeps h no more
        if self._batch is not None:
            llama_cpp.llama_batch_ext_free(self._batch)
            self._batch = None
        self._ctx.close()
