"""Ollama's embedding routes: /api/embed, and the older /api/embeddings (one prompt, a vector as the
model gives it)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi import Request as HTTPRequest

from ollama_spec.server.http.parsed import ParsedRoute
from ollama_spec.server.protocol.ollama import EmbeddingsRequest, EmbedRequest
from ollama_spec.server.serving.embedding import embed_all
from ollama_spec.server.serving.state import ServerState, durations

router = APIRouter(route_class=ParsedRoute)


@router.post("/api/embed")
async def embed(body: EmbedRequest, http_request: HTTPRequest) -> dict:
    state: ServerState = http_request.app.state.server
    served = await state.acquire(body.model, body.keep_alive)
    texts = [body.input] if isinstance(body.input, str) else body.input
    if not any(texts):  # Ollama's way to load an embedding model: nothing to embed
        return {"model": body.model, "embeddings": []}
    vectors, n_tokens = await embed_all(served, texts, body.truncate, body.dimensions, fit_dimensions=True)
    took = durations()  # as Ollama: from the request's arrival, waits included
    return {
        "model": body.model,
        "embeddings": [v.tolist() for v in vectors],
        "total_duration": int(took.total * 1e9),
        "load_duration": int(took.load * 1e9),
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
