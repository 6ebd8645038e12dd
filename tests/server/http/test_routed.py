"""The route matched once (http/routed.py): Routed finds it before the middleware, Dispatch hands the request
to it without the router matching again; what no route answers whole stays the router's (404, 405)."""

import asyncio
from collections import Counter

import httpx
from fastapi import APIRouter, FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Match

from ollama_spec.server.http.routed import Dispatch, Routed, matched_route


def app_with(seen: list) -> FastAPI:
    router = APIRouter()

    @router.post("/api/chat")
    async def chat() -> dict:
        return {"route": "chat"}

    @router.get("/v1/models/{model:path}")
    async def model(model: str) -> dict:
        return {"model": model}

    app = FastAPI()
    app.include_router(router)

    class Peek:  # a middleware between Routed and the router: sees the route matched
        def __init__(self, inner):
            self.inner = inner

        async def __call__(self, scope, receive, send):
            if scope["type"] == "http":
                route = matched_route(scope)
                seen.append(getattr(route, "path", None))
            await self.inner(scope, receive, send)

    Dispatch.install(app.router)
    app.add_middleware(Peek)
    app.add_middleware(Routed, routes=router.routes)
    return app


def answers(app: FastAPI, *asked: tuple[str, str]) -> list[httpx.Response]:
    """The app's answers to (method, path) requests, in process."""

    async def ask() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return [await client.request(method, path) for method, path in asked]

    return asyncio.run(ask())


def test_each_request_is_matched_once_and_answered_by_its_route(monkeypatch):
    seen: list = []
    full: Counter = Counter()
    matches = APIRoute.matches

    def counted(self, scope):
        match, child = matches(self, scope)
        full[self.path] += match is Match.FULL
        return match, child

    monkeypatch.setattr(APIRoute, "matches", counted)
    chat, model = answers(app_with(seen), ("POST", "/api/chat"), ("GET", "/v1/models/hf.co/a/b:Q4"))
    assert chat.json() == {"route": "chat"} and model.json() == {"model": "hf.co/a/b:Q4"}
    assert seen == ["/api/chat", "/v1/models/{model:path}"]
    assert full == {"/api/chat": 1, "/v1/models/{model:path}": 1}


def test_what_no_route_answers_whole_is_the_routers():
    seen: list = []
    wrong_method, nothing = answers(app_with(seen), ("GET", "/api/chat"), ("POST", "/api/nothing"))
    assert wrong_method.status_code == 405 and nothing.status_code == 404  # 405: the path matches, not the method
    assert seen == [None, None]
