"""What goes on to the upstream Ollama daemon (serve --upstream), decided before any route reads a request:
a route this server does not serve (/api/create, /api/push, /api/blobs/..., any other path), and, when
serving the store, a request for a model it cannot run here (not in its store, a cloud or MLX model),
or a delete or copy of a model its store does not have (`ollama rm` through our address). The request
goes on unchanged (upstream.Upstream.forward), its answer streamed back.

Which routes name a model, and where, is read off the app's route table (`route_table`), never listed
apart: a route's body model or path names it, or the route declares it (`forwarded`); one that does
neither stops the app from being built."""

from __future__ import annotations

import asyncio
import types
import typing
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

from pydantic import BaseModel
from starlette.requests import Request
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ollama_spec.server.http.parsed import parsed_body
from ollama_spec.server.http.routed import ROUTE, matched_route

if TYPE_CHECKING:
    from ollama_spec.server.serving.state import ServerState

MODEL = "model"  # goes on when it names a model this server does not serve (not in its store, cloud, MLX)
STORE = "store"  # an edit of the store: goes on when the store does not have the model it names
HERE = "here"  # never goes on: answered here whatever it names
FALLBACK_ROUTES = {"unsupported"}  # the catch-all that answers 404/501 when nothing is forwarded
NAMING = ("model", "name")  # a request body's fields that name its model, as Ollama's do (name: older clients)
NO_BODY = frozenset({"GET", "HEAD"})  # methods whose body is never read for a name
Endpoint = TypeVar("Endpoint", bound=Callable)


class UnclassifiedRoute(Exception):
    """A route of the app says nothing of how it is forwarded and its signature does not tell."""


@dataclass(frozen=True)
class Forwarded:
    """How a route's requests go on: `kind` (MODEL, STORE or HERE) and the body `fields` that may name the
    model (none: it is named in the path, as `{model}`)."""

    kind: str
    fields: tuple[str, ...] = ()


def forwarded(kind: str, *fields: str) -> Callable[[Endpoint], Endpoint]:
    """Declare, on a route that reads its body itself, how its requests are forwarded."""

    def declare(endpoint: Endpoint) -> Endpoint:
        endpoint.forwarded = Forwarded(kind, fields)
        return endpoint

    return declare


def route_table(routes: Sequence[BaseRoute]) -> list[tuple[BaseRoute, Forwarded]]:
    """Each of `routes` (the fallback left out) with how it is forwarded: as its endpoint declares
    (`forwarded`), else read off its signature: a `{model}` in the path or a body model with a NAMING field is
    MODEL, a route without a body HERE. Any other route is an UnclassifiedRoute, so none is forgotten."""
    return [(route, _classified(route)) for route in routes if getattr(route, "name", None) not in FALLBACK_ROUTES]


def _classified(route: BaseRoute) -> Forwarded:
    if (declared := getattr(getattr(route, "endpoint", None), "forwarded", None)) is not None:
        return declared
    dependant = getattr(route, "dependant", None)
    if dependant is not None:
        if any(param.name == "model" for param in dependant.path_params):
            return Forwarded(MODEL)
        for param in dependant.body_params:
            if fields := tuple(f for f in NAMING if f in _model_fields(param.field_info.annotation)):
                return Forwarded(MODEL, fields)
        if not dependant.body_params and getattr(route, "methods", None) and route.methods <= NO_BODY:
            return Forwarded(HERE)
    methods = " ".join(sorted(getattr(route, "methods", None) or ["?"]))
    raise UnclassifiedRoute(
        f"{methods} {getattr(route, 'path', route)}: say how it is forwarded to an upstream daemon "
        "(http/forwarding.forwarded on its endpoint, or a body model with a field in NAMING)"
    )


def _model_fields(annotation: object) -> dict:
    """The fields of the pydantic model `annotation` is (or one of its union's members)."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    for member in typing.get_args(annotation) if union else (annotation,):
        if isinstance(member, type) and issubclass(member, BaseModel):
            return member.model_fields
    return {}


class Forwarding:
    """Forward to `state.upstream` what this server does not answer itself; without one, a pass-through.
    `table`: the app's routes and how each is forwarded (`route_table`)."""

    def __init__(self, app: ASGIApp, state: ServerState, table: Sequence[tuple[BaseRoute, Forwarded]]):
        self.app, self.state = app, state
        self.table = {id(route): how for route, how in table}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        upstream = self.state.upstream
        if scope["type"] != "http" or upstream is None:
            return await self.app(scope, receive, send)
        how = self.table.get(id(matched_route(scope)))  # as routed.Routed matched it
        if how is None:  # a route only the fallback (or nothing) answers: the daemon's
            answer = await upstream.forward(Request(scope, receive), _streamed(receive))
            return await answer(scope, receive, send)
        if self.state.serving.answers_every_name or how.kind == HERE:  # a pinned pair answers every name
            return await self.app(scope, receive, send)
        ours = self.state.serves if how.kind == MODEL else self._stored
        if not how.fields:  # named in the path (GET /v1/models/{model})
            name = scope[ROUTE][1].get("path_params", {}).get("model")
            if name and not await ours(name):
                answer = await upstream.forward(Request(scope, receive), b"")
                return await answer(scope, receive, send)
        elif scope["method"] not in NO_BODY:
            messages, complete = await _read(receive, self.state.settings.max_body_bytes)
            name = _model_named(parsed_body(scope), how.fields) if complete else None
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


def _model_named(body: object, fields: tuple[str, ...]) -> str | None:
    """The model a body names (CheckedBodies parsed it: the value, or None for no body)."""
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
