"""HTTP errors, answered in the format of the API that was called, and a generation's error as one."""

from __future__ import annotations

from starlette.responses import JSONResponse

from ollama_spec.errors import OllamaSpecError
from ollama_spec.server.worker import Cancelled, QueueFull

TOO_LONG = "context_length_exceeded"  # OpenAI's code for a prompt (plus max_tokens) past the context
# OpenAI's error types and codes by status, where the error brings none of its own: OpenAI answers a bad key
# as an invalid request with the code "invalid_api_key"; its codes are strings, or null.
OPENAI_ERROR_TYPES = {500: "server_error", 503: "server_overloaded"}
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


def openai_error(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object: `code` a string or null, never the HTTP status (typed clients parse it as text)."""
    return {
        "message": message,
        "type": OPENAI_ERROR_TYPES.get(status, "invalid_request_error"),
        "param": param,
        "code": code or OPENAI_ERROR_CODES.get(status),
    }


def error_response(
    path: str, status: int, message: str, param: str | None = None, code: str | None = None
) -> JSONResponse:
    """An error answered in the format of the API at `path`: OpenAI's under /v1, Ollama's elsewhere."""
    if path.startswith("/v1/"):
        return JSONResponse({"error": openai_error(status, message, param, code)}, status_code=status)
    return JSONResponse({"error": message}, status_code=status)


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
