"""The FastAPI application: both APIs over one ServerState, with auth, checked bodies, /health and /metrics.

Every error is answered in the format of the API that was called: OpenAI's
`{"error": {"message", "type", "param", "code"}}` under /v1, Ollama's `{"error": "..."}` elsewhere.
"""

from __future__ import annotations

import hmac

from fastapi import FastAPI
from fastapi import Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.middleware.cors import CORSMiddleware
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from ollama_spec import __version__
from ollama_spec.errors import OllamaSpecError
from ollama_spec.server.http.bodies import CheckedBodies, JsonBodies
from ollama_spec.server.http.browsers import BrowserGuard, is_loopback_bind, origin_pattern
from ollama_spec.server.http.forwarding import Forwarding, route_table
from ollama_spec.server.http.ollama import embeddings as ollama_embeddings
from ollama_spec.server.http.ollama import generate, manage, models
from ollama_spec.server.http.openai import chat, completions, responses
from ollama_spec.server.http.openai import embeddings as openai_embeddings
from ollama_spec.server.http.routed import Dispatch, Routed
from ollama_spec.server.protocol.errors import ApiError, error_response
from ollama_spec.server.serving.metrics import CONTENT_TYPE, CountRefusals
from ollama_spec.server.serving.state import CLOCK, HELD, Clock, ServerState
from ollama_spec.server.serving.store_reads import one_read_each

UNGUARDED = {"/health"}  # answers without the API key, for load balancers and probes


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
        return {"status": "ok", **state.serving.health(), "waiting": state.waiting}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.exception_handler(ApiError)
    @app.exception_handler(OllamaSpecError)  # the core's typed errors, each by its class
    async def api_error(request: HTTPRequest, exc: Exception) -> JSONResponse:
        return error_response(request.url.path, exc)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_error(exc)
        return error_response(request.url.path, ApiError(400, message, param))

    @app.exception_handler(HTTPException)
    async def http_error(request: HTTPRequest, exc: HTTPException) -> JSONResponse:
        return error_response(request.url.path, ApiError(exc.status_code, str(exc.detail)))

    # the app's routes in the order its router tries them: the routers' (the catch-all last), then its own
    own = [route for route in app.router.routes if isinstance(route, APIRoute)]  # beside the included routers
    routes = [*(route for router in routers for route in router.routes), *own]
    Dispatch.install(app.router)  # the route Routed matched answers: the router does not match again
    # innermost first: each add_middleware wraps what was added before it
    app.add_middleware(JsonBodies)
    # outside it: what goes to the upstream daemon goes as it came (a blob upload, any size, any type);
    # how each route is forwarded is read off the route table here, so a route nobody classified fails now
    table = route_table(routes)
    app.state.forwarding = table
    app.add_middleware(Forwarding, state=state, table=table)
    app.add_middleware(Leases, state=state)  # outside it: a request's store reads serve the forwarder too
    # outside that: a body for one of the app's own routes is checked before it is answered or forwarded
    app.add_middleware(CheckedBodies, routes=[route for route, _ in table], max_bytes=state.settings.max_body_bytes)
    app.add_middleware(Routed, routes=routes)  # outside them all: the route that answers, matched once
    app.add_middleware(CountRefusals, metrics=state.metrics)  # outside it: malformed bodies are refusals too
    if state.settings.api_key:
        app.add_middleware(BearerAuth, api_key=state.settings.api_key)
    # a browser's preflight carries no API key and must be answered before BearerAuth
    origins = origin_pattern(state.settings.origins)
    app.add_middleware(CORSMiddleware, allow_origin_regex=origins.pattern, allow_methods=["*"], allow_headers=["*"])
    # outermost: a foreign page or a rebinding Host is refused before anything else reads the request
    app.add_middleware(BrowserGuard, origins=origins, check_host=is_loopback_bind(state.settings.host))
    return app


def describe_validation_error(exc: RequestValidationError) -> tuple[str, str | None]:
    """pydantic's first complaint as one line, and the field it is about."""
    error = exc.errors()[0]
    if error["type"] == "json_invalid":
        return f"the request body is not valid JSON: {error.get('ctx', {}).get('error', error['msg'])}", None
    where = [str(part) for part in error["loc"] if part != "body"]
    if not where:
        return f"the request body must be a JSON object: {error['msg']}", None
    return f"{'.'.join(where)}: {error['msg']}", where[0]


class Leases:
    """The pairs a request acquired stay held until its whole answer is sent (a stream too), so that no
    eviction or expiry unloads a model under a request; then their keep_alive starts counting."""

    def __init__(self, app: ASGIApp, state: ServerState):
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        held: list = []
        token, clock = HELD.set(held), CLOCK.set(Clock())
        try:
            with one_read_each():  # a name the request asks for is read from the store once
                await self.app(scope, receive, send)
        finally:
            HELD.reset(token)
            CLOCK.reset(clock)
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
                return await error_response(scope["path"], ApiError(401, message))(scope, receive, send)
        await self.app(scope, receive, send)
