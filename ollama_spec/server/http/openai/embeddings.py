"""OpenAI's embeddings: /v1/embeddings, as floats or base64."""

from __future__ import annotations

import base64

import numpy as np
from fastapi import APIRouter
from fastapi import Request as HTTPRequest

from ollama_spec.server.http.parsed import ParsedRoute
from ollama_spec.server.protocol.openai import EmbeddingsRequest, each_input
from ollama_spec.server.serving.embedding import embed_all
from ollama_spec.server.serving.state import ServerState

router = APIRouter(prefix="/v1", route_class=ParsedRoute)


@router.post("/embeddings")
async def embeddings(body: EmbeddingsRequest, http_request: HTTPRequest) -> dict:
    state: ServerState = http_request.app.state.server
    served = await state.acquire(body.model)
    vectors, n_tokens = await embed_all(served, each_input(body.input), True, body.dimensions)
    data = [
        {"object": "embedding", "index": i, "embedding": _encoded(v, body.encoding_format)}
        for i, v in enumerate(vectors)
    ]
    return {
        "object": "list",
        "data": data,
        "model": served.model_name,
        "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens},
    }


def _encoded(vector: np.ndarray, encoding: str) -> list[float] | str:
    if encoding == "base64":  # little-endian float32, as OpenAI sends it (its Python client asks for this)
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()
