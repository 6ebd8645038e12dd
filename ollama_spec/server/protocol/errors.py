"""HTTP errors, answered in the format of the API that was called: the one place the core's typed errors
become a status and a body.

The serving core raises OllamaSpecError subclasses; `api_error` maps each to its status (`STATUSES`),
and only the route modules raise an ApiError of their own. Every error body is built here, one function
for each API (`ollama_error_body`, `openai_error_body`), and every error answer is `error_response`: the
app's handlers, the middlewares that answer before any route (body checks, the API key), the store routes
and the upstream's 502 alike.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from ollama_spec.errors import (
    BodyTooLarge,
    Busy,
    InvalidRequest,
    ModelNotFound,
    OllamaSpecError,
    PromptTooLong,
    ServerFault,
    UpstreamUnreachable,
)
from ollama_spec.server.serving.worker import Cancelled, ModelDeleted, QueueFull

TOO_LONG = "context_length_exceeded"  # OpenAI's code for a prompt (plus max_tokens) past the context
# OpenAI's error types and codes by status, where the error brings none of its own: OpenAI answers a bad key
# as an invalid request with the code "invalid_api_key"; its codes are strings, or null.
OPENAI_ERROR_TYPES = {500: "server_error", 502: "server_error", 503: "server_overloaded"}
OPENAI_ERROR_CODES = {401: "invalid_api_key"}
# the status of each typed error, the first class that matches; any other OllamaSpecError is the client's (400)
STATUSES: tuple[tuple[type[OllamaSpecError], int], ...] = (
    (ModelDeleted, 404),  # a generation whose model was deleted: gone, as for a request after the delete
    (Cancelled, 503),  # a generation the server stopped: it is shutting down
    (InvalidRequest, 400),
    (ModelNotFound, 404),
    (BodyTooLarge, 413),
    (ServerFault, 500),
    (UpstreamUnreachable, 502),
)


class ApiError(Exception):
    """An HTTP error answered in the format of the API that was called; `code` is OpenAI's machine-readable
    name for it (such as "context_length_exceeded"), None where OpenAI gives none."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}


def openai_error(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object: `code` a string or null, never the HTTP status (typed clients parse it as text)."""
    return {
        "message": message,
        "type": OPENAI_ERROR_TYPES.get(status, "invalid_request_error"),
        "param": param,
        "code": code or OPENAI_ERROR_CODES.get(status),
    }


def openai_error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error body: `{"error": {"message", "type", "param", "code"}}`."""
    return {"error": openai_error(status, message, param, code)}


def ollama_error_body(message: str) -> dict:
    """Ollama's error body: `{"error": "..."}` (its api.StatusError), in a stream's last line too."""
    return {"error": message}


def error_body(path: str, status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """An error's body in the format of the API at `path`: OpenAI's under /v1/, Ollama's elsewhere."""
    if path.startswith("/v1/"):
        return openai_error_body(status, message, param, code)
    return ollama_error_body(message)


def error_response(path: str, error: Exception) -> JSONResponse:
    """The one answer to an error (an ApiError, or the core's as `api_error` maps it), in the format of the
    API at `path`, with its headers (Retry-After)."""
    error = api_error(error)
    answer = JSONResponse(error_body(path, error.status, error.message, error.param, error.code), error.status)
    answer.headers.update(error.headers)  # after the answer's own headers
    return answer


def api_error(error: Exception) -> ApiError:
    """Any error as the HTTP error it is answered with: a typed error of the core by its class (`STATUSES`);
    anything else a generation raised, the server's fault (500)."""
    if isinstance(error, ApiError):
        return error
    message = str(error)
    if isinstance(error, (Busy, QueueFull)):
        return ApiError(503, message, headers={"Retry-After": str(error.retry_after)})
    if isinstance(error, PromptTooLong):
        return ApiError(400, message, error.param, TOO_LONG)
    if not isinstance(error, OllamaSpecError):
        return ApiError(500, f"generation failed: {type(error).__name__}: {error}")
    status = next((status for kind, status in STATUSES if isinstance(error, kind)), 400)
    return ApiError(status, message, getattr(error, "param", None))


def failure(error: Exception) -> OllamaSpecError:
    """A generation's error as the core's: itself where it is one, else a ServerFault that names it."""
    if isinstance(error, OllamaSpecError):
        return error
    return ServerFault(f"generation failed: {type(error).__name__}: {error}")
