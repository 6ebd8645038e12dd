"""The FastAPI application: both APIs over one ServerState, with auth, a body limit, /health and /metrics.

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
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import __version__
from . import embeddings, ollama, ollama_models, openai, responses
from .common import ApiError, ServerState, openai_error
from .metrics import CONTENT_TYPE

# Origins that may call the server from a browser without --origins, as Ollama allows them: pages on
# this machine (any port) and desktop or editor apps.
LOCAL_ORIGINS = (r"https?://(localhost|127\.0\.0\.1|0\.0\.0\.0|\[::1\])(:\d+)?"
                 r"|(app|file|tauri|vscode-webview|vscode-file)://.*")
UNGUARDED = {"/health"}  # answers without the API key, for load balancers and probes


def create_app(state: ServerState) -> FastAPI:
    """The server's ASGI app; `state` holds the loaded engine and the worker that runs it."""
    app = FastAPI(title="ollama-spec", version=__version__, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = state
    app.include_router(openai.router)
    app.include_router(embeddings.router)
    app.include_router(responses.router)
    app.include_router(ollama_models.router)
    app.include_router(ollama.router)  # last: its catch-all answers Ollama's model-management routes

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": state.model_name, "waiting": state.worker.waiting}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.exception_handler(ApiError)
    async def api_error(request: HTTPRequest, exc: ApiError) -> JSONResponse:
        return error_response(request.url.path, exc.status, exc.message, exc.param, exc.code)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: HTTPRequest, exc: RequestValidationError) -> JSONResponse:
        message, param = describe_validation_error(exc)
        return error_response(request.url.path, 400, message, param)

    @app.exception_handler(HTTPException)
    async def http_error(request: HTTPRequest, exc: HTTPException) -> JSONResponse:
        if isinstance(exc.__cause__, BodyTooLarge):  # FastAPI wraps errors raised while reading the body
            return _too_large(request.url.path, state.settings.max_body_bytes)
        return error_response(request.url.path, exc.status_code, str(exc.detail))

    if state.settings.api_key:
        app.add_middleware(BearerAuth, api_key=state.settings.api_key)
    app.add_middleware(BodyLimit, max_bytes=state.settings.max_body_bytes)
    app.add_middleware(JsonBodies)
    # outermost: a browser's preflight carries no API key and must be answered before BearerAuth
    app.add_middleware(CORSMiddleware, allow_origin_regex=LOCAL_ORIGINS, allow_origins=list(state.settings.origins),
                       allow_methods=["*"], allow_headers=["*"])
    return app


def error_response(path: str, status: int, message: str, param: str | None = None,
                   code: str | None = None) -> JSONResponse:
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

        await self.app(scope, counted, send)


class JsonBodies:
    """Read every request body as JSON, whatever its Content-Type says, as Ollama does: Ollama's own
    examples post with `curl -d '{...}'`, which labels the body as a form."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("POST", "PUT", "DELETE"):
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = dict(scope, headers=[*headers, (b"content-type", b"application/json")])
        await self.app(scope, receive, send)


class BearerAuth:
    """With --api-key, every route but /health needs `Authorization: Bearer KEY`."""

    def __init__(self, app: ASGIApp, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in UNGUARDED:
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                message = "a valid API key is needed: send the header 'Authorization: Bearer KEY'"
                return await error_response(scope["path"], 401, message)(scope, receive, send)
        await self.app(scope, receive, send)
