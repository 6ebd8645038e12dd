"""Embeddings of the loaded target: text or token ids in, one vector out, the context made on first use."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np

from ollama_spec.errors import InvalidSetting
from ollama_spec.llama.embedding import Embedder
from ollama_spec.llama.model import LoadedModel
from ollama_spec.llama.threads import apart


class Embeddings:
    """The target's embeddings; its embedding context is made on the first request, freed on `close`."""

    def __init__(self, target: LoadedModel):
        self.target = target
        self._embedder: Embedder | None = None
        # one embedding context, and a server's slots may ask for embeddings at once: one at a time
        self._lock = threading.Lock()

    def embed(self, text: str | Sequence[int], *, truncate: bool = True) -> tuple[np.ndarray, int]:
        """The target's embedding of `text` (or of token ids), not normalized, and the tokens it read.

        Too long a text is cut to its first tokens when `truncate`, else refused."""
        with self._lock:  # apart: the caller's thread keeps no OpenMP team beside the step loop's (llama/threads.py)
            return apart(lambda stop: self._embed(text, truncate))

    def _embed(self, text: str | Sequence[int], truncate: bool) -> tuple[np.ndarray, int]:
        if self._embedder is None:
            self._embedder = Embedder(self.target)
        if isinstance(text, str):
            tokens = self.target.tokenize(text, add_bos=self.target.add_bos, special=False)
        else:
            tokens = list(text)
            if any(not 0 <= token < self.target.n_vocab for token in tokens):
                raise InvalidSetting(f"token ids must be in 0..{self.target.n_vocab - 1}")
        if len(tokens) > self._embedder.max_tokens:
            if not truncate:
                raise InvalidSetting(
                    f"the input is {len(tokens)} tokens, more than the {self._embedder.max_tokens} "
                    "an embedding reads; shorten it or allow truncation"
                )
            tokens = tokens[: self._embedder.max_tokens]
        return self._embedder.embed(tokens), len(tokens)

    def close(self) -> None:
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
