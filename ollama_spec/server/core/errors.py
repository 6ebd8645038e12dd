"""HTTP errors, answered in the format of the API that was called, and a generation's error as one.

Every error body is built here, one function for each API (`ollama_error_body`, `openai_error_body`),
and every error answer is `error_response` of an ApiError: the app's handlers, the middlewares that
answer before any route (body checks, the API key), the store routes and the upstream's 502 alike.
"""

from __future__ import annotations

from starlette.responses import JSONResponse

from ollama_spec.errors import OllamaSpecError
from ollama_spec.server.worker import Cancelled, QueueFull

TOO_LONG = "context_length_exceeded"  # OpenAI's code for a prompt (plus max_tokens) past the context
# OpenAI's error types and codes by status, where the error brings none of its own: OpenAI answers a bad key
# as an invalid request with the code "invalid_api_key"; its codes are strings, or null.
OPENAI_ERROR_TYPES = {500: "server_error", 502: "server_error", 503: "server_overloaded"}
OPENAI_ERROR_CODES = {401: "invalid_api_key"}


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

    @classmethod
    def busy(cls, exc: QueueFull) -> ApiError:
        """503 for a full queue, with the seconds to wait in Retry-After."""
        return cls(503, str(exc), headers={"Retry-After": str(exc.retry_after)})


class TooLong(ApiError):
    """A prompt (and its max_tokens) past the context, as OpenAI answers it (400, context_length_exceeded);
    `wanted`: the context that would hold it, which a server may load the model again with."""

    def __init__(self, message: str, wanted: int, param: str | None = None):
        super().__init__(400, message, param, TOO_LONG)
        self.wanted = wanted


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


def error_response(path: str, error: ApiError) -> JSONResponse:
    """The one answer to an ApiError, in the format of the API at `path`, with its headers (Retry-After)."""
    answer = JSONResponse(error_body(path, error.status, error.message, error.param, error.code), error.status)
    answer.headers.update(error.headers)  # after the answer's own headers
    return answer


def failure(error: Exception) -> ApiError:
    """A generation's error as an HTTP error: the client's fault (400), ours (500), or a generation the
    server stopped (503: it is shutting down)."""
    if isinstance(error, Cancelled):
        return ApiError(503, str(error))
    if isinstance(error, QueueFull):
        return ApiError.busy(error)
    if isinstance(error, OllamaSpecError):
        return ApiError(400, str(error))
    return ApiError(500, f"generation failed: {type(error).__name__}: {error}")
