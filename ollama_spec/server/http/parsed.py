"""A request body parsed once: http/bodies.CheckedBodies parses and checks it before any route, and leaves
the value in the ASGI scope; the routes' body models read that value instead of parsing the bytes again."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.routing import APIRoute
from starlette.responses import Response
from starlette.types import Scope

PARSED = "ollama_spec.parsed_body"  # the scope's key for the body's JSON value


def parsed_body(scope: Scope) -> Any:
    """The body's JSON value as CheckedBodies parsed it; None when it did not (no body, another route)."""
    return scope.get(PARSED)


class ParsedRequest(Request):
    """A request whose `json()` is the value CheckedBodies parsed, when it parsed one."""

    async def json(self) -> Any:
        if not hasattr(self, "_json") and PARSED in self.scope:
            self._json = self.scope[PARSED]
        return await super().json()


class ParsedRoute(APIRoute):
    """An API route whose body model is validated from the body CheckedBodies parsed (every router's
    route_class)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parsed(request: Request) -> Response:
            return await handler(ParsedRequest(request.scope, request.receive))

        return parsed
