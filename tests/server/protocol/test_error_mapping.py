"""Typed errors mapped once: the serving core raises OllamaSpecError subclasses, and protocol/errors.api_error is
the one place that turns them into a status; only the route modules (and the app's handlers) make an ApiError."""

import ast
import asyncio
from pathlib import Path

import pytest

import ollama_spec.server
from ollama_spec.errors import (
    BodyTooLarge,
    Busy,
    InsufficientMemory,
    InvalidRequest,
    InvalidSetting,
    ModelNotFound,
    PromptTooLong,
    ServerFault,
    UpstreamUnreachable,
)
from ollama_spec.server.protocol.errors import TOO_LONG, ApiError, api_error, failure
from ollama_spec.server.serving.worker import Cancelled, Job, ModelDeleted, QueueFull

SERVER = Path(ollama_spec.server.__file__).parent
# the route modules of each API, the app (its handlers and the API-key middleware) and the handler itself
MAY_RAISE = (
    "http/ollama/",
    "http/openai/",
    "http/app.py",
    "protocol/errors.py",
)


def _makes_api_errors(path: Path) -> list[int]:
    """The lines of `path` that raise or build an ApiError (a call of it or of one of its class methods)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        target = node.exc if isinstance(node, ast.Raise) else node.func if isinstance(node, ast.Call) else None
        if isinstance(target, ast.Call):
            target = target.func
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
            target = target.value  # ApiError.something(...)
        if isinstance(target, ast.Name) and target.id == "ApiError":
            lines.append(node.lineno)
    return sorted(set(lines))


def test_no_api_error_is_made_below_the_routes():
    made = {
        f"{path.relative_to(SERVER)}:{line}"
        for path in SERVER.rglob("*.py")
        if not path.relative_to(SERVER).as_posix().startswith(MAY_RAISE)
        for line in _makes_api_errors(path)
    }
    assert not made, f"ApiError made outside the route modules: raise a typed error of ollama_spec.errors: {made}"


def test_the_check_finds_an_api_error(tmp_path):
    made = tmp_path / "made.py"
    made.write_text("def f():\n    raise ApiError(400, 'no')\n\n\ndef g():\n    return ApiError.busy(None)\n")
    assert _makes_api_errors(made) == [2, 6]


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (InvalidRequest("bad", "think"), 400),
        (InvalidSetting("bad"), 400),  # any other error of the core is the client's
        (InsufficientMemory("too big"), 400),  # as a generation's error; the scheduler's refusal is a ServerFault
        (ModelNotFound("gone"), 404),
        (BodyTooLarge("big"), 413),
        (ServerFault("store"), 500),
        (UpstreamUnreachable("down"), 502),
        (Cancelled("the server is shutting down"), 503),
        (ModelDeleted('model "m" is being deleted'), 404),  # gone: a retry would find nothing
    ],
)
def test_each_typed_error_has_its_status(error, status):
    answer = api_error(error)
    assert (answer.status, answer.message, answer.param, answer.code) == (
        status,
        str(error),
        getattr(error, "param", None),
        None,
    )


def test_too_long_carries_openais_code_and_busy_its_retry_after():
    too_long = api_error(PromptTooLong("long", 4096, "max_tokens"))
    assert (too_long.status, too_long.param, too_long.code) == (400, "max_tokens", TOO_LONG)
    for busy in (Busy("wait", 5), QueueFull("full", 7)):
        assert (api_error(busy).status, api_error(busy).headers) == (503, {"Retry-After": str(busy.retry_after)})


def test_an_api_error_is_answered_as_it_is_and_anything_else_is_a_failed_generation():
    own = ApiError(401, "key")
    assert api_error(own) is own
    failed = api_error(RuntimeError("boom"))
    assert (failed.status, failed.message) == (500, "generation failed: RuntimeError: boom")
    assert (
        isinstance(failure(RuntimeError("boom")), ServerFault) and str(failure(RuntimeError("boom"))) == failed.message
    )


def test_a_job_cut_short_by_a_delete_fails_as_deleted_and_one_by_shutdown_as_cancelled():
    async def jobs() -> tuple[Job, Job]:
        loop = asyncio.get_running_loop()
        return Job(None, loop), Job(None, loop)

    deleted, stopped = asyncio.run(jobs())
    deleted.cancel('model "m" is being deleted', ModelDeleted)
    stopped.cancel()
    assert deleted.cancelled_as is ModelDeleted and api_error(deleted.cancelled_as(deleted.reason)).status == 404
    assert stopped.cancelled_as is Cancelled and api_error(stopped.cancelled_as(stopped.reason)).status == 503
