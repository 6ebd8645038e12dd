"""Ollama's store routes that act: /api/pull (through `ollama-spec pull`'s machinery, its progress
streamed), /api/delete and /api/copy (pull/edits), answered as Ollama's routes.go answers them.

From the server's state these use only `models_dir` (the store, None: as `pull` finds it),
`await store_changed()` (after a write that succeeded) and `await delete(name, remove)` (the scheduler's:
the model's pairs finish their requests and close before its files go).
Errors are `{"error": "..."}` in one line (protocol/errors' ApiError, answered by its error_response); they never
leave the store half-written.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ValidationError

from ollama_spec.errors import InvalidModelName, ModelNotFound, OllamaSpecError, StoreNotFound, one_line
from ollama_spec.models.names import parse_model_name
from ollama_spec.pull.api_events import pull_events
from ollama_spec.pull.edits import copy_model, deletable_name, delete_model
from ollama_spec.server.http.forwarding import HERE, STORE, forwarded
from ollama_spec.server.http.parsed import ParsedRoute
from ollama_spec.server.protocol.errors import ApiError, error_response
from ollama_spec.server.protocol.framing import ndjson
from ollama_spec.server.protocol.ollama_manage import CopyRequest, DeleteRequest, PullModelRequest

router = APIRouter(route_class=ParsedRoute)
Body = TypeVar("Body", bound=BaseModel)
SUCCESS = {"status": "success"}


def _answered(route: Callable[[HTTPRequest], Awaitable[Response]]) -> Callable[[HTTPRequest], Awaitable[Response]]:
    """The routes' errors answered as the app answers every ApiError (here too, for the routes alone
    on an app of their own); an OllamaSpecError is one: a bad name a 400, a pull's before its first line
    (Ollama's status: 500) or the store's, a 500."""

    @functools.wraps(route)
    async def answer(http_request: HTTPRequest) -> Response:
        try:
            return await route(http_request)
        except ApiError as exc:
            return error_response(http_request.url.path, exc)
        except OllamaSpecError as exc:
            status = 400 if isinstance(exc, InvalidModelName) else 500
            return error_response(http_request.url.path, _refused(status, str(exc)))

    return answer


def _refused(status: int, message: str) -> ApiError:
    """A refusal in one line: its message quotes the names asked, which may hold any character."""
    return ApiError(status, one_line(message))


@router.post("/api/pull")
@forwarded(HERE)  # the server pulls into its own store, with or without a daemon
@_answered
async def pull(http_request: HTTPRequest) -> Response:
    """Stream the pull's progress (NDJSON) unless `stream` is false: then its last object, or its error."""
    state, body = http_request.app.state.server, await _read(http_request, PullModelRequest)
    parse_model_name(body.asked)
    events = pull_events(body.asked, insecure=body.insecure, models_dir=state.models_dir)
    first = await anext(events)  # an error before any progress is the answer's status, as Ollama's
    if body.stream:
        return ndjson(_streamed(first, events, state))
    last = first
    async for last in _noticed(first, events, state):
        pass
    return JSONResponse(last)


async def _noticed(first: dict, events: AsyncIterator[dict], state: Any) -> AsyncIterator[dict]:
    """The events with `first` in front; the server is told of the new model before "success" goes out."""
    if first == SUCCESS:
        await state.store_changed()
    yield first
    async for chunk in events:
        if chunk == SUCCESS:
            await state.store_changed()
        yield chunk


async def _streamed(first: dict, events: AsyncIterator[dict], state: Any) -> AsyncIterator[dict]:
    """A failure after the first line becomes the stream's last line, `{"error": ...}`."""
    try:
        async for chunk in _noticed(first, events, state):
            yield chunk
    except OllamaSpecError as exc:
        raise ApiError(500, str(exc)) from None
    finally:
        await events.aclose()  # a client that hangs up stops the pull


@router.delete("/api/delete")
@forwarded(STORE, "model", "name")  # `ollama rm` of a model only the daemon has
@_answered
async def delete(http_request: HTTPRequest) -> Response:
    """Remove the model's manifest, then the blobs no other manifest names, once the pairs that load it have
    ended their running requests and closed. 200 with no body."""
    state, body = http_request.app.state.server, await _read(http_request, DeleteRequest)
    if body.asked != body.asked.strip():
        raise _refused(400, f'name "{body.asked}" is invalid')  # Ollama's words: a padded name is no name
    try:
        # a read-only store fails here, before anything is unloaded for it
        name = await asyncio.to_thread(deletable_name, body.asked, state.models_dir)
        await state.delete(name, functools.partial(delete_model, models_dir=state.models_dir))
    except (ModelNotFound, StoreNotFound):  # the scheduler's too: another delete took it first
        raise _refused(404, f"model '{body.asked}' not found") from None  # Ollama's words (its quotes, too)
    await state.store_changed()
    return Response(status_code=200)


@router.post("/api/copy")
@forwarded(STORE, "source")
@_answered
async def copy(http_request: HTTPRequest) -> Response:
    """A second name for a model: a new manifest naming the same blobs. 200 with no body. A loaded model
    the copy replaced is loaded again for its next request."""
    state, body = http_request.app.state.server, await _read(http_request, CopyRequest)
    for kind, value in (("source", body.source), ("destination", body.destination)):
        try:
            if value != value.strip():  # Ollama's ParseName trims nothing: a padded name is no name
                raise InvalidModelName(value)
            parse_model_name(value)
        except InvalidModelName:
            raise _refused(400, f'{kind} "{value}" is invalid') from None
    try:
        await asyncio.to_thread(copy_model, body.source, body.destination, state.models_dir)
    except (ModelNotFound, StoreNotFound):
        raise _refused(404, f'model "{body.source}" not found') from None
    await state.store_changed()
    return Response(status_code=200)


async def _read(http_request: HTTPRequest, model: type[Body]) -> Body:
    """The JSON body as `model`; refused as Ollama refuses it ("missing request body" included)."""
    raw = await http_request.body()
    if not raw.strip():
        raise _refused(400, "missing request body")
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"])
        raise _refused(400, f"{where}: {error['msg']}" if where else f"invalid request body: {error['msg']}") from None
