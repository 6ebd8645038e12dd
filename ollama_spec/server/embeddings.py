"""Embedding routes of both APIs: Ollama's /api/embed and /api/embeddings, OpenAI's /v1/embeddings.

The loaded target embeds (see embedding.py), on the engine's thread between generations.
"""

from __future__ import annotations

import base64
import time
from typing import Literal

import numpy as np
from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from pydantic import BaseModel, ConfigDict, Field

from ollama_spec.llama.embedding import normalized
from ollama_spec.errors import OllamaSpecError
from ollama_spec.server.common import ApiError, ServerState, failure
from ollama_spec.server.worker import QueueFull

router = APIRouter()


class OllamaEmbedRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # options, keep_alive

    model: str
    input: str | list[str] = Field(default_factory=list)
    truncate: bool = True
    dimensions: int | None = None  # used only between 0 and the vector's size, as Ollama does


class OllamaEmbeddingsRequest(BaseModel):  # the older route: one prompt, a vector as the model gives it
    model_config = ConfigDict(extra="ignore")

    model: str
    prompt: str = ""


class OpenAIEmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # user

    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)


@router.post("/api/embed")
async def embed(body: OllamaEmbedRequest, http_request: HTTPRequest) -> dict:
    state: ServerState = http_request.app.state.server
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not any(texts):  # Ollama's way to load an embedding model: nothing to embed
        return {"model": body.model, "embeddings": []}
    started = time.perf_counter()
    vectors, n_tokens = await _embed_all(state, texts, body.truncate, body.dimensions, fit_dimensions=True)
    return {"model": body.model, "embeddings": [v.tolist() for v in vectors],
            "total_duration": int((time.perf_counter() - started) * 1e9), "load_duration": 0,
            "prompt_eval_count": n_tokens}


@router.post("/api/embeddings")
async def embeddings(body: OllamaEmbeddingsRequest, http_request: HTTPRequest) -> dict:
    state: ServerState = http_request.app.state.server
    if not body.prompt:
        return {"embedding": []}  # as Ollama answers an empty prompt
    vector, _ = await _call(state, lambda: state.engine.embed(body.prompt))
    return {"embedding": vector.tolist()}


@router.post("/v1/embeddings")
async def openai_embeddings(body: OpenAIEmbeddingsRequest, http_request: HTTPRequest) -> dict:
    state: ServerState = http_request.app.state.server
    given = body.input
    if isinstance(given, list) and given and all(isinstance(t, int) for t in given):
        given = [given]  # one text as token ids
    inputs = [given] if isinstance(given, str) else list(given)
    vectors, n_tokens = await _embed_all(state, inputs, True, body.dimensions)
    data = [{"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
            for i, v in enumerate(vectors)]
    return {"object": "list", "data": data, "model": state.model_name,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


async def _embed_all(state: ServerState, inputs: list, truncate: bool, dimensions: int | None, *,
                     fit_dimensions: bool = False) -> tuple[list[np.ndarray], int]:
    """Each input (text, or token ids) embedded and normalized, cut to `dimensions` first if asked
    (`fit_dimensions`: Ollama's way, a size that is not less than the vector's leaves it whole)."""
    if not inputs:
        raise ApiError(400, "input is empty: give a text or a list of texts", "input")
    if any(isinstance(text, str) and not text for text in inputs):
        raise ApiError(400, "input holds an empty text", "input")
    vectors, total = [], 0
    for item in inputs:
        vector, n = await _call(state, lambda item=item: state.engine.embed(item, truncate=truncate))
        if fit_dimensions and dimensions is not None and not 0 < dimensions < vector.size:
            dimensions = None
        if dimensions is not None:
            if dimensions > vector.size:
                raise ApiError(400, f"dimensions {dimensions} is more than the model's {vector.size}", "dimensions")
            vector = vector[:dimensions]
        vectors.append(normalized(vector))
        total += n
    return vectors, total


async def _call(state: ServerState, work):
    try:
        return await state.worker.call(work)
    except OllamaSpecError as exc:
        if isinstance(exc, QueueFull):
            state.metrics.rejected.inc()
        raise failure(exc) from None


def _encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, as OpenAI sends it (its Python client asks for this)
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
