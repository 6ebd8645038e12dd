"""Ollama's embedding routes: /api/embed, and the older /api/embeddings (one prompt, a vector as the
model gives it)."""

from __future__ import annotations

import time

from fastapi import APIRouter
from fastapi import Request as HTTPRequest

from ollama_spec.server.core.embedding import embed_all
from ollama_spec.server.core.state import ServerState, load_waited
from ollama_spec.server.ollama.protocol import EmbeddingsRequest, EmbedRequest

router = APIRouter()


@router.post("/api/embed")
async def embed(body: EmbedRequest, http_request: HTTPRequest) -> dict:
    state: ServerState = http_request.app.state.server
    served = await state.acquire(body.model, body.keep_alive)
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not any(texts):  # Ollama's way to load an embedding model: nothing to embed
        return {"model": body.model, "embeddings": []}
    started = time.perf_counter()
    vectors, n_tokens = await embed_all(served, texts, body.truncate, body.dimensions, fit_dimensions=True)
    load = load_waited()  # as Ollama: the load this request waited for is in its total
    return {
        "model": body.model,
        "embeddings": [v.tolist() for v in vectors],
        "total_duration": int((load + time.perf_counter() - started) * 1e9),
        "load_duration": int(load * 1e9),
        "prompt_eval_count": n_tokens,
    }


@router.post("/api/embeddings")
async def embeddings(body: EmbeddingsRequest, http_request: HTTPRequest) -> dict:
    state: ServerState = http_request.app.state.server
    served = await state.acquire(body.model, body.keep_alive)
    if not body.prompt:
        return {"embedding": []}  # as Ollama answers an empty prompt
    vector, _ = await served.call(lambda: served.engine.embed(body.prompt))
    return {"embedding": vector.tolist()}
