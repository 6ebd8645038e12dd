"""What goes on to the upstream Ollama daemon (serve --upstream), decided before any route reads a request:
a route this server does not serve (/api/create, /api/push, /api/blobs/..., any other path), and, when
serving the store, a request for a model it cannot run here (not in its store, a cloud or MLX model),
or a delete or copy of a model its store does not have (`ollama rm` through our address). The request
goes on unchanged (upstream.Upstream.forward), its answer streamed back."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence

from starlette.requests import Request
from starlette.routing import BaseRoute, Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ollama_spec.server.core.state import ServerState

# The routes whose JSON body names the model to answer: (method, path) -> the body fields that may name it.
MODEL_ROUTES: dict[tuple[str, str], tuple[str, ...]] = {
    ("POST", "/api/chat"): ("model",),
    ("POST", "/api/generate"): ("model",),
    ("POST", "/api/embed"): ("model",),
    ("POST", "/api/embeddings"): ("model",),
    ("POST", "/api/show"): ("model", "name"),
    ("POST", "/v1/chat/completions"): ("model",),
    ("POST", "/v1/completions"): ("model",),
    ("POST", "/v1/embeddings"): ("model",),
    ("POST", "/v1/responses"): ("model",),
}
# The store's edits of a model that exists: (method, path) -> the body fields that may name it.
STORE_ROUTES: dict[tuple[str, str], tuple[str, ...]] = {
    ("DELETE", "/api/delete"): ("model", "name"),
    ("POST", "/api/copy"): ("source",),
}
MODEL_CARD = "/v1/models/"  # GET /v1/models/{id}: the model is in the path
FALLBACK_ROUTES = {"unsupported"}  # the catch-all that answers 404/501 when nothing is forwarded


class Forwarding:
    """Forward to `state.upstream` what this server does not answer itself; without one, a pass-through.
    `routes`: the routes the app serves (the fallback among them is left out)."""

    def __init__(self, app: ASGIApp, state: ServerState, routes: Sequence[BaseRoute]):
        self.app, self.state = app, state
        self.routes = [route for route in routes if getattr(route, "name", None) not in FALLBACK_ROUTES]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upstream = self.state.upstream
        if scope["type"] != "http" or upstream is None:
            return await self.app(scope, receive, send)
        if not any(route.matches(scope)[0] is Match.FULL for route in self.routes):
            answer = await upstream.forward(Request(scope, receive), _streamed(receive))
            return await answer(scope, receive, send)
        if self.state.serving.answers_every_name:  # a pinned pair
            return await self.app(scope, receive, send)
        route = (scope["method"], scope["path"])
        fields = MODEL_ROUTES.get(route) or STORE_ROUTES.get(route)
        ours = self.state.serves if route in MODEL_ROUTES else self._stored
        if scope["method"] == "GET" and scope["path"].startswith(MODEL_CARD):
            name = scope["path"][len(MODEL_CARD) :]
            if name and not await self.state.serves(name):
                answer = await upstream.forward(Request(scope, receive), b"")
                return await answer(scope, receive, send)
        elif fields is not None:
            messages, complete = await _read(receive, self.state.settings.max_body_bytes)
            name = _model_named(messages, fields) if complete else None
            if name is not None and not await ours(name):
                body = b"".join(m.get("body", b"") for m in messages)
                answer = await upstream.forward(Request(scope, receive), body)
                return await answer(scope, receive, send)
            receive = _replayed(messages, receive)
        await self.app(scope, receive, send)

    async def _stored(self, name: str) -> bool:
        """Whether the store has `name` (a bad name, a broken manifest: yes, the route answers it)."""
        return await asyncio.to_thread(self.state.serving.has_model, name)


async def _streamed(receive: Receive) -> AsyncIterator[bytes]:
    """The request's body as it arrives (a blob upload may be gigabytes: never held whole)."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        if body := message.get("body", b""):
            yield body
        if not message.get("more_body", False):
            return


async def _read(receive: Receive, limit: int) -> tuple[list[Message], bool]:
    """The body's messages, up to about `limit` bytes (BodyLimit answers a longer one); whether it is all."""
    messages: list[Message] = []
    size = 0
    while size <= limit:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request" or not message.get("more_body", False):
            return messages, message["type"] == "http.request"
        size += len(message.get("body", b""))
    return messages, False


def _model_named(messages: list[Message], fields: tuple[str, ...]) -> str | None:
    try:
        body = json.loads(b"".join(m.get("body", b"") for m in messages))
    except ValueError:  # not JSON: the route says so
        return None
    if not isinstance(body, dict):
        return None
    for field in fields:
        if isinstance(value := body.get(field), str) and value.strip():
            return value
    return None


def _replayed(messages: list[Message], receive: Receive) -> Receive:
    """`receive` with the messages already read given first."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay
