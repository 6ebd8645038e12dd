"""The FastAPI application: both APIs over one ServerState, with auth, a body limit, /health and /metrics.

Every error is answered in the format of the API that was called: OpenAI's
`{"error": {"message", "type", "param", "code"}}` under /v1, Ollama's `{"error": "..."}` elsewhere.
"""

from __future__ import annotations

import hmac
import json
import re
from typing import Any

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from ollama_spec import __version__
from ollama_spec.server.browsers import BrowserGuard, is_loopback_bind, origin_pattern
from ollama_spec.server.core.errors import ApiError, openai_error
from ollama_spec.server.core.state import HELD, ServerState
from ollama_spec.server.forwarding import Forwarding
from ollama_spec.server.metrics import CONTENT_TYPE
from ollama_spec.server.ollama import embeddings as ollama_embeddings
from ollama_spec.server.ollama import generate, manage, models
from ollama_spec.server.openai import chat, completions, responses
from ollama_spec.server.openai import embeddings as openai_embeddings

UNGUARDED = {"/health"}  # answers without the API key, for load balancers and probes
OWN = {"health", "metrics"}  # the app's own routes, beside the routers'


def create_app(state: ServerState) -> FastAPI:
    """The server's ASGI app; `state` holds the loaded engine and the worker that runs it."""
    app = FastAPI(title="ollama-spec", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    routers = [r.router for r in (chat, completions, responses, openai_embeddings, ollama_embeddings, models, manage)]
    routers.append(generate.router)  # last: its catch-all answers the routes no other one does
    for router in routers:
        app.include_router(router)

    @app.get("/health")
    async def health() -> dict:
        if state.pinned is not None:
            return {"status": "ok", "model": state.model_name, "waiting": state.waiting}
        return {"status": "ok", "loaded": [served.name for served in state.loaded()], "waiting": state.waiting}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.exception_handler(ApiError)
    async def api_error(request: HTTPRequest, exc: ApiError) -> JSONResponse:
        answer = error_response(request.url.path, exc.status, exc.message, exc.param, exc.code)
        answer.headers.update(exc.headers)
        return answer

    @app.exception_handler(RequestValidationError)
    async def invalid(request: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_error(exc)
        return error_response(request.url.path, 400, message, param)

    @app.exception_handler(HTTPException)
    async def http_error(request: HTTPRequest, exc: HTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, BodyTooLarge):  # FastAPI wraps errors raised while reading the body
            return _too_large(request.url.path, state.settings.max_body_bytes)
        return error_response(request.url.path, exc.status_code, str(exc.detail))

    # innermost first: each add_middleware wraps what was added before it
    app.add_middleware(Leases, state=state)
    app.add_middleware(JsonBodies)
    app.add_middleware(BodyLimit, max_bytes=state.settings.max_body_bytes)  # outside JsonBodies, which buffers
    # outside both: what goes to the upstream daemon goes as it came (a blob upload, any size, any type)
    served = [route for router in routers for route in router.routes]
    app.add_middleware(
        Forwarding, state=state, routes=[*served, *(r for r in app.router.routes if getattr(r, "name", None) in OWN)]
    )
    if state.settings.api_key:
        app.add_middleware(BearerAuth, api_key=state.settings.api_key)
    # a browser's preflight carries no API key and must be answered before BearerAuth
    origins = origin_pattern(state.settings.origins)
    app.add_middleware(CORSMiddleware, allow_origin_regex=origins.pattern, allow_methods=["*"], allow_headers=["*"])
    # outermost: a foreign page or a rebinding Host is refused before anything else reads the request
    app.add_middleware(BrowserGuard, origins=origins, check_host=is_loopback_bind(state.settings.host))
    return app


def error_response(
    path: str, status: int, message: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    if path.startswith("/v1/"):
        return JSONResponse({"error": openai_error(status, message, param, code)}, status_code=status)
    return JSONResponse({"error": message}, status_code=status)


def describe_validation_error(exc: RequestValidationError) -> tuple[str, str | None]:
    """pydantic's first complaint as one line, and the field it is about."""
    error = exc.errors()[0]
    if error["type"] == "json_invalid":
        return f"the request body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}", None
    where = [str(part) for part in error["loc"] if part != "body"]
    if not where:
        return f"the request body must be a JSON object: {error['msg']}", None
    return f"{'.'.join(where)}: {error['msg']}", where[0]


class BodyTooLarge(Exception):
    pass


def _too_large(path: str, max_bytes: int) -> JSONResponse:
    return error_response(path, 413, f"the request body is larger than {max_bytes} bytes")


class BodyLimit:
    """Refuse bodies over `max_bytes`: by Content-Length up front, else while they arrive."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            return await _too_large(scope["path"], self.max_bytes)(scope, receive, send)
        received = 0

        async def counted() -> dict:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_bytes:
                raise BodyTooLarge()
            return message

        try:
            await self.app(scope, counted, send)
        except BodyTooLarge:  # read by a middleware (JsonBodies), before any route could answer it
            await _too_large(scope["path"], self.max_bytes)(scope, receive, send)


# A surrogate can reach JSON text only as a \uD800-\uDFFF escape; bodies without one are not parsed here.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins a proper pair into one character


def lone_surrogate_at(value: Any, path: tuple = ()) -> tuple | None:
    """The path to the first text in a parsed JSON value that holds a lone surrogate (for a key: the path
    to its object, since the key itself cannot be written back), or None."""
    if isinstance(value, str):
        return path if _SURROGATE.search(value) else None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        if isinstance(key, str) and _SURROGATE.search(key):
            return path
        if (found := lone_surrogate_at(item, (*path, key))) is not None:
            return found
    return None


class JsonBodies:
    """Read every request body as JSON, whatever its Content-Type says, as Ollama does (Ollama's own
    examples post with `curl -d '{...}'`, which labels the body as a form), and refuse text that JSON
    can carry but Unicode cannot (a lone surrogate, "\\ud800"): a 400 naming the field, before any
    route tries to encode it."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "DELETE"):
            return await self.app(scope, receive, send)
        headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
        scope = dict(scope, headers=[*headers, (b"content-type", b"application/json")])
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                return
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if _SURROGATE_ESCAPE.search(body) and (where := _lone_surrogate_in(body)) is not None:
            field = ".".join(map(str, where)) or "the request body"
            message = (
                f"{field}: the text holds a lone surrogate (an unpaired \\ud800-\\udfff escape), which is "
                "not Unicode; send the text as UTF-8"
            )
            return await error_response(scope["path"], 400, message, str(where[0]) if where else None)(
                scope, receive, send
            )
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()  # what comes after the body: the client's disconnect
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)


def _lone_surrogate_in(body: bytes) -> tuple | None:
    try:
        return lone_surrogate_at(json.loads(body))
    except ValueError:  # not JSON: the route answers that
        return None


class Leases:
    """The pairs a request acquired stay held until its whole answer is sent (a stream too), so that no
    eviction or expiry unloads a model under a request; then their keep_alive starts counting."""

    def __init__(self, app: ASGIApp, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held: list = []
        token = HELD.set(held)
        try:
            await self.app(scope, receive, send)
        finally:
            HELD.reset(token)
            await self.state.release_all(held)


class BearerAuth:
    """With --api-key, every route but /health needs `Authorization: Bearer KEY`."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app, self.expected = app, api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in UNGUARDED:
            scheme, _, given = dict(scope["headers"]).get(b"authorization", b"").strip().partition(b" ")
            # RFC 7235: the scheme is case-insensitive ("bearer KEY" is as good as "Bearer KEY")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(given.strip(), self.expected):
                message = "a valid API key is needed: send the header 'Authorization: Bearer KEY'"
                return await error_response(scope["path"], 401, message)(scope, receive, send)
        await self.app(scope, receive, send)
