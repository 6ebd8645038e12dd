"""Embeddings for both APIs: the loaded target embeds (llama/embedding.py), on the engine's thread
between generations, in the same bounded queue."""

from __future__ import annotations

from typing import Any

import numpy as np

from ollama_spec.errors import InvalidRequest
from ollama_spec.llama.embedding import normalized
from ollama_spec.server.serving.loaded import Served


def texts_only(data: Any) -> Any:
    """A request body whose `input` must be text or texts (a pydantic "before" validator's part).
    Token ids are refused as Ollama refuses them: a client's ids are its tokenizer's (langchain-openai
    sends cl100k's by default), and read as this model's own they would embed other tokens unsaid."""
    given = data.get("input") if isinstance(data, dict) else None
    if isinstance(given, list) and not all(isinstance(item, str) for item in given):
        raise InvalidRequest(
            "invalid input type: give a text or a list of texts; token ids are not read, since they would be "
            "taken as this model's own (langchain-openai: OpenAIEmbeddings(check_embedding_ctx_length=False))",
            "input",
        )
    return data


async def embed_all(
    state: Served, inputs: list, truncate: bool, dimensions: int | None, *, fit_dimensions: bool = False
) -> tuple[list[np.ndarray], int]:
    """Each input (text, or token ids) embedded and normalized, cut to `dimensions` first if asked
    (`fit_dimensions`: Ollama's way, a size that is not less than the vector's leaves it whole)."""
    if not inputs:
        raise InvalidRequest("input is empty: give a text or a list of texts", "input")
    if any(isinstance(text, str) and not text for text in inputs):
        raise InvalidRequest("input holds an empty text", "input")
    vectors, total = [], 0
    for item in inputs:
        vector, n = await state.call(lambda item=item: state.engine.embed(item, truncate=truncate))
        if fit_dimensions and dimensions is not None and not 0 < dimensions < vector.size:
            dimensions = None
        if dimensions is not None:
            if dimensions > vector.size:
                raise InvalidRequest(f"dimensions {dimensions} is more than the model's {vector.size}", "dimensions")
            vector = vector[:dimensions]
        vectors.append(normalized(vector))
        total += n
    return vectors, total
