"""Request bodies, checked where they are first read: before any route, and before anything goes on to the
upstream daemon (serve --upstream), so that every malformed body is the same one-line 400 on every route.

A body must be UTF-8 JSON text holding an object, as Ollama's decoder wants it, and more: no NaN or
Infinity (not JSON; Python's decoder takes them), no number past a float's range (Python reads 1e400 as
inf), no text that JSON can carry but Unicode cannot (a lone surrogate, "\\ud800"), and arrays and
objects nested at most MAX_NESTING deep. Ollama refuses nesting past 10,000; far less here, because
routes walk what they are given with Python's own recursion (a JSON schema into a grammar, tools into a
chat template), which a few hundred levels exhaust. No request of either API nests more than a dozen.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Receive, Scope, Send

from ollama_spec.errors import BodyTooLarge, InvalidRequest
from ollama_spec.server.http.parsed import PARSED
from ollama_spec.server.http.routed import matched_route
from ollama_spec.server.protocol.errors import error_response
from ollama_spec.server.protocol.shared import MAX_NESTING, nesting

MAX_DIGITS = 4300  # Python's own limit for reading an integer (sys.int_max_str_digits), said in our words
# A surrogate can reach JSON text only as a \uD800-\uDFFF escape once the bytes are strict UTF-8.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins a proper pair into one character
# A body's bytes as the shape of its numbers: digits as 1, e and E as e, signs as s, anything else a space.
_NUMBER_SHAPE = bytes(49 if 48 <= i <= 57 else 101 if i in b"eE" else 115 if i in b"+-" else 32 for i in range(256))
_TOO_DEEP = f"the request body nests arrays and objects more than {MAX_NESTING} deep"


class Malformed(ValueError):
    """Why a body is refused, in one line; `field`: where in it, if known."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


def checked_body(body: bytes) -> Any:
    """The JSON object in `body`; Malformed for anything a route should never be given."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Malformed(f"the request body is not UTF-8 text (byte {exc.start}): send JSON as UTF-8") from None
    # the hooks for numbers run per number in Python: only for a body with a number that needs them
    hooks = {"parse_float": _finite, "parse_int": _integer} if _long_number(body) else {}
    try:
        value = json.loads(text, parse_constant=_not_json, **hooks)
    except RecursionError:  # deeper than Python's decoder goes
        raise Malformed(_TOO_DEEP) from None
    except Malformed:
        raise
    except ValueError as exc:
        raise Malformed(f"the request body is not valid JSON: {exc}") from None
    if nesting(body) > MAX_NESTING:
        raise Malformed(_TOO_DEEP)
    if not isinstance(value, dict):
        raise Malformed(f"the request body must be a JSON object, not {_kind(value)}")
    if _SURROGATE_ESCAPE.search(body) and (where := lone_surrogate_at(value)) is not None:
        raise Malformed(
            f"{'.'.join(map(str, where)) or 'the request body'}: the text holds a lone surrogate (an unpaired "
            "\\ud800-\\udfff escape), which is not Unicode; send the text as UTF-8",
            str(where[0]) if where else None,
        )
    return value


def _long_number(body: bytes) -> bool:
    """Whether `body` may hold a number past a float's range (1e400, 400 digits) or past Python's digits
    (a string that looks like one counts too): a search of its bytes, far quicker than a regex."""
    shape = body.translate(_NUMBER_SHAPE)
    return b"1" * 300 in shape or b"e111" in shape or b"es111" in shape


def _not_json(constant: str) -> Any:
    raise Malformed(f"the request body is not valid JSON: {constant} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if math.isinf(value):
        raise Malformed(f"the request body is not valid JSON: the number {text[:40]} is past a float's range")
    return value


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise Malformed(f"the request body is not valid JSON: a number of more than {MAX_DIGITS} digits")
    return int(text)


def _kind(value: Any) -> str:
    return {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(type(value), "a number")


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


class CheckedBodies:
    """Read the body of every request for one of `routes` (the app's own: what goes to the upstream
    daemon unasked, such as a blob upload, goes as it came), refuse it as `checked_body` does or when it
    is over `max_bytes` (413), and hand it on whole. A request without a body is the route's to answer."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute], max_bytes: int):
        self.app, self.routes, self.max_bytes = app, {id(route) for route in routes}, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or id(matched_route(scope)) not in self.routes:  # as routed.Routed matched it
            return await self.app(scope, receive, send)
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            return await self._too_large(scope, receive, send)
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.max_bytes:
                return await self._too_large(scope, receive, send)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if body.strip():
            try:
                scope = dict(scope, **{PARSED: checked_body(body)})  # the routes read this value: parsed once
            except Malformed as exc:
                refused = InvalidRequest(str(exc), exc.field)
                return await error_response(scope["path"], refused)(scope, receive, send)
        replayed = False

        async def replay() -> dict:
            nonlocal replayed
            if replayed:
                return await receive()  # what comes after the body: the client's disconnect
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _too_large(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = f"the request body is larger than {self.max_bytes} bytes"
        await error_response(scope["path"], BodyTooLarge(message))(scope, receive, send)


class JsonBodies:
    """Label every request body as JSON, whatever its Content-Type says, as Ollama reads them (Ollama's
    own examples post with `curl -d '{...}'`, which labels the body as a form)."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = [(k, v) for k, v in scope["headers"] if k != b"content-type"]
            scope = dict(scope, headers=[*headers, (b"content-type", b"application/json")])
        await self.app(scope, receive, send)
