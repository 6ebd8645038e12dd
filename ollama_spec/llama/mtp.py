"""MTP: a target's own NextN layer drafting for it, in an MTP context over the target's model.

The protocol is an EAGLE-3 head's (eagle3.py): at memory position P the NextN layer reads
(t[P+1], h[P]), where h is the target's final pre-norm state instead of an encoder's g, and each
draft step's own pre-norm state is the next step's h. So `MtpHead` is an `Eagle3Head` without a
model of its own or an encoder: the target, loaded with its NextN tensors (`LoadSettings.load_mtp`),
keeps h for every row it reads, and the MTP context (`LLAMA_CONTEXT_TYPE_MTP`, `ctx_other` = the
target's) holds the NextN layer's own cache, cut back with the target's.
"""

from __future__ import annotations

import threading

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
        self.calls.set_nextn(self._ctx.ctx, True, True)  # each draft step's own pre-norm state
        self.calls.set_nextn(target.llama_context, True, False)  # the target's h, every row
        target.observer = self

    def _features(self, n_entries: int, order: list[int]) -> np.ndarray:
        """The target's pre-norm state h of entries `order`."""
        ptr = self.calls.get_nextn(self.target.llama_context)
        if not ptr:
            raise InferenceError("the target kept no pre-norm state for its MTP layer")
        rows = np.ctypeslib.as_array(ptr, shape=(n_entries, self.n_embd))[order]
        return np.ascontiguousarray(rows, dtype=np.float32)

    def _encode(self, features: np.ndarray) -> np.ndarray:
        return features  # the NextN layer reads h as it is

    def close(self) -> None:
        if getattr(self.target, "observer", None) is self:
            self.target.observer = None
        if self._batch is not None:
            llama_cpp.llama_batch_ext_free(self._batch)
            self._batch = None
        self._ctx.close()
