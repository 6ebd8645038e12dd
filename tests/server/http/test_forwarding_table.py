"""What goes on to the upstream daemon is read off the app's own route table: every route the app declares
is forwarded by the model it names, by the store's edit it asks for, or never; a route that cannot be read
so and declares nothing stops the app from being built."""

from __future__ import annotations

import pytest
from fastapi import Request

from ollama_spec.server import ServerSettings, ServerState, create_app
from ollama_spec.server.http.forwarding import (
    FALLBACK_ROUTES,
    HERE,
    MODEL,
    STORE,
    UnclassifiedRoute,
    forwarded,
    route_table,
)
from ollama_spec.server.http.ollama import manage

# what serve --upstream has forwarded since it began: (method, path) -> (kind, the body fields naming the model)
EXPECTED = {
    ("POST", "/api/chat"): (MODEL, ("model",)),
    ("POST", "/api/generate"): (MODEL, ("model",)),
    ("POST", "/api/embed"): (MODEL, ("model",)),
    ("POST", "/api/embeddings"): (MODEL, ("model",)),
    ("GET", "/api/show"): (MODEL, ("model", "name")),  # a GET's body is never read: see Forwarding
    ("POST", "/api/show"): (MODEL, ("model", "name")),
    ("POST", "/v1/chat/completions"): (MODEL, ("model",)),
    ("POST", "/v1/completions"): (MODEL, ("model",)),
    ("POST", "/v1/embeddings"): (MODEL, ("model",)),
    ("POST", "/v1/responses"): (MODEL, ("model",)),
    ("GET", "/v1/models/{model:path}"): (MODEL, ()),  # named in the path
    ("DELETE", "/api/delete"): (STORE, ("model", "name")),
    ("POST", "/api/copy"): (STORE, ("source",)),
    ("POST", "/api/pull"): (HERE, ()),
    ("GET", "/v1/models"): (HERE, ()),
    ("GET", "/"): (HERE, ()),
    ("HEAD", "/"): (HERE, ()),
    **{(method, path): (HERE, ()) for path in ("/api/version", "/api/tags", "/api/ps") for method in ("GET", "HEAD")},
    ("GET", "/health"): (HERE, ()),
    ("GET", "/metrics"): (HERE, ()),
}


def state(tiny_store) -> ServerState:
    from ollama_spec.server.serving.pairs import StorePairs
    from ollama_spec.server.serving.scheduler import Scheduler, SchedulerSettings

    store = StorePairs(models_dir=str(tiny_store), no_draft=True)
    return ServerState(None, ServerSettings(), Scheduler(store, SchedulerSettings(), None, 8))


def test_every_route_the_app_declares_is_classified(tiny_store):
    app = create_app(state(tiny_store))
    table = app.state.forwarding  # the table its Forwarding reads
    classified = {
        (method, route.path): (how.kind, how.fields) for route, how in table for method in sorted(route.methods)
    }
    assert classified == EXPECTED  # a route added to the app and left out of EXPECTED fails here too
    assert not FALLBACK_ROUTES & {route.name for route, _ in table}  # what only it answers goes on as it came


def test_a_route_that_cannot_be_read_says_so():
    from fastapi.routing import APIRoute

    async def upload(http_request: Request) -> None: ...

    with pytest.raises(UnclassifiedRoute, match="PUT /api/blobs/x: say how it is forwarded"):
        route_table([APIRoute("/api/blobs/x", upload, methods=["PUT"])])
    declared = forwarded(HERE)(upload)
    assert route_table([APIRoute("/api/blobs/x", declared, methods=["PUT"])])[0][1].kind == HERE


def test_a_route_added_without_a_class_stops_the_app(tiny_store, monkeypatch):
    async def rename(http_request: Request) -> dict:  # reads its own body: nothing says what names the model
        return await http_request.json()

    monkeypatch.setattr(manage.router, "routes", list(manage.router.routes))
    manage.router.add_api_route("/api/rename", rename, methods=["POST"])
    with pytest.raises(UnclassifiedRoute, match="POST /api/rename"):
        create_app(state(tiny_store))
