"""The route that answers a request, matched once: `Routed` matches it against the app's routes before anything
reads the request, and leaves the route in the ASGI scope; the body check (bodies.CheckedBodies), the forwarder
(forwarding.Forwarding) and the app's router (`Dispatch`) take it from there instead of matching again."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.routing import BaseRoute, Match, Router
from starlette.types import ASGIApp, Receive, Scope, Send

ROUTE = "ollama_spec.route"  # the scope's key for (the route that answers it, what its match adds to the scope)


def matched_route(scope: Scope) -> BaseRoute | None:
    """The route Routed found for this request; None when none answers it whole (a 404, a 405)."""
    found = scope.get(ROUTE)
    return found[0] if found is not None else None


class Routed:
    """Match each HTTP request against `routes` (the app's, in the order its router tries them), once."""

    def __init__(self, app: ASGIApp, routes: Sequence[BaseRoute]):
        self.app, self.routes = app, list(routes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for route in self.routes:
                match, child = route.matches(scope)
                if match is Match.FULL:
                    scope = dict(scope, **{ROUTE: (route, child)})
                    break
        await self.app(scope, receive, send)


class Dispatch:
    """The app router's first step: a request Routed matched goes straight to its route, as the router would
    send it (Router.app); any other (no route, a wrong method, the lifespan) to the router itself."""

    def __init__(self, router: Router):
        self.router, self.app = router, router.middleware_stack

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = scope.get(ROUTE) if scope["type"] == "http" else None
        if found is None:
            return await self.app(scope, receive, send)
        route, child = found
        scope.setdefault("router", self.router)
        scope["route"] = route
        scope.update(child)
        await route.handle(scope, receive, send)

    @classmethod
    def install(cls, router: Router) -> None:
        """Put Dispatch in front of `router`'s own matching."""
        router.middleware_stack = cls(router)
