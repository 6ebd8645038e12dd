"""Embeddings from the loaded target, for the servers' /api/embed, /api/embeddings and /v1/embeddings.

A second llama.cpp context on the target's weights (no second copy of them), made on the first
embedding request: it costs only its own KV cache and compute buffers, which a server that never
embeds never pays. As Ollama does for a generative model, a text's embedding is its last token's
hidden state, unless the GGUF names another pooling (an embedding model's mean or CLS).
"""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp
import numpy as np
from llama_cpp._internals import LlamaContext

from ollama_spec.errors import InferenceError, ModelLoadError
from ollama_spec.llama.load_params import set_lora_adapters
from ollama_spec.llama.model import LoadedModel

# Longest text embedded at once: the whole text is one llama.cpp batch, whose compute buffer grows
# with it (a few hundred MiB at 2,048 tokens for an 8B model).
MAX_EMBED_TOKENS = 2048


class Embedder:
    def __init__(self, model: LoadedModel, max_tokens: int = MAX_EMBED_TOKENS):
        self.model = model
        self.max_tokens = min(max_tokens, model.n_ctx)
        self._ctx = self._context(llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED)
        if llama_cpp.llama_pooling_type(self._ctx.ctx) == llama_cpp.LLAMA_POOLING_TYPE_NONE:
            self._ctx.close()  # a generative model: its last token stands for the text
            self._ctx = self._context(llama_cpp.LLAMA_POOLING_TYPE_LAST)
        self.n_embd = llama_cpp.llama_model_n_embd(model.llama_model.model)
        self._batch = llama_cpp.llama_batch_init(self.max_tokens, 0, 1)

    def _context(self, pooling: int) -> LlamaContext:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = params.n_batch = params.n_ubatch = self.max_tokens
        params.n_seq_max = 1
        params.n_threads = params.n_threads_batch = self.model.n_threads
        params.embeddings = True
        params.pooling_type = pooling
        params.no_perf = True
        try:
            context = LlamaContext(model=self.model.llama_model, params=params, verbose=False)
        except ValueError:
            raise ModelLoadError(
                f"llama.cpp could not make an embedding context of {self.max_tokens} tokens for "
                f"{self.model.path.name} (out of memory?)"
            ) from None
        if self.model.adapters and set_lora_adapters(context.ctx, self.model.adapters) != 0:
            context.close()
            raise ModelLoadError(f"llama.cpp could not set the LoRA adapters of {self.model.path.name} for embeddings")
        return context

    def embed(self, tokens: Sequence[int]) -> np.ndarray:
        """One text's embedding (n_embd floats, as the model computes it: not normalized)."""
        if not tokens:
            raise InferenceError("cannot embed an empty text")
        if len(tokens) > self.max_tokens:
            raise InferenceError(f"the text is {len(tokens)} tokens; embeddings take at most {self.max_tokens}")
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self._ctx.ctx), True)
        batch = self._batch
        batch.n_tokens = len(tokens)
        for i, token in enumerate(tokens):
            batch.token[i], batch.pos[i], batch.n_seq_id[i], batch.logits[i] = token, i, 1, True
            batch.seq_id[i][0] = 0
        code = llama_cpp.llama_decode(self._ctx.ctx, batch)
        if code != 0:
            raise InferenceError(f"llama.cpp could not embed {len(tokens)} tokens (llama_decode: {code})")
        pointer = llama_cpp.llama_get_embeddings_seq(self._ctx.ctx, 0)
        if not pointer:
            raise InferenceError("llama.cpp returned no embedding for the text")
        return np.ctypeslib.as_array(pointer, shape=(self.n_embd,)).copy()

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        self._ctx.close()


def normalized(vector: np.ndarray) -> np.ndarray:
    """Unit length, as Ollama's /api/embed and OpenAI's embeddings return them."""
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector
