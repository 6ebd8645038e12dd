"""One error body for each API: every place that refuses a request (a route's ApiError, pydantic, Starlette,
the body check, the API key, the store routes, the upstream's 502; a pinned pair and the whole store)
answers in exactly the body protocol/errors builds for that API and status, and the same refusal through
different routes reads the same."""

from __future__ import annotations

import httpx
import pytest

from ollama_spec.server.protocol.errors import error_body
from tests.pull_servers import closed_port
from tests.serving import running_store, serving_tiny_pair

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
KEY = "secret"
AUTH = {"Authorization": f"Bearer {KEY}"}

# (what refuses, method, path, body, status); the body is JSON unless bytes
REFUSALS = [
    ("route: no such model", "POST", "/api/chat", {"model": "nope"} | CHAT, 404),
    ("route: no such model", "POST", "/v1/chat/completions", {"model": "nope"} | CHAT, 404),
    ("pydantic", "POST", "/api/chat", {"model": 7} | CHAT, 400),
    ("pydantic", "POST", "/v1/chat/completions", {"model": "m", "messages": "hi"}, 400),
    ("starlette", "GET", "/api/chat", None, 405),
    ("starlette", "GET", "/v1/nothing-here", None, 404),
    ("body check", "POST", "/api/generate", b'{"model": ', 400),
    ("body check", "POST", "/v1/completions", b"[1, 2]", 400),
    ("store route: no such model", "DELETE", "/api/delete", {"model": "nope"}, 404),
    ("store route: copy of nothing", "POST", "/api/copy", {"source": "nope", "destination": "b"}, 404),
    ("store route: no body", "POST", "/api/copy", b"", 400),
    ("store route: a bad name", "POST", "/api/pull", {"model": "a b c"}, 400),
    ("fallback", "POST", "/api/create", {"model": "x"}, 501),
]


def answers(url: str, refusals=REFUSALS, headers=AUTH) -> list[tuple[str, str, httpx.Response]]:
    found = []
    for what, method, path, body, status in refusals:
        content = body if isinstance(body, bytes) else None
        json = None if isinstance(body, bytes) else body
        answer = httpx.request(method, url + path, content=content, json=json, headers=headers, timeout=60)
        assert answer.status_code == status, (what, path, answer.text)
        found.append((what, path, answer))
    return found


def assert_built_by_core(path: str, answer: httpx.Response) -> None:
    """`answer`'s body is byte for byte what protocol/errors builds for its API and status."""
    body = answer.json()
    assert answer.headers["content-type"] == "application/json", (path, answer.headers)
    if path.startswith("/v1/"):
        error = body["error"]
        assert isinstance(error, dict) and isinstance(error["message"], str), (path, body)
        expected = error_body(path, answer.status_code, error["message"], error["param"])
    else:
        assert isinstance(body["error"], str), (path, body)
        expected = error_body(path, answer.status_code, body["error"])
    assert body == expected, (path, body)


@pytest.fixture(scope="module")
def store_server(tiny_store):
    with running_store(tiny_store, api_key=KEY, no_draft=True) as (url, _):
        yield url


def test_every_refusal_of_the_store_server_is_the_one_body_of_its_api(store_server):
    for _, path, answer in answers(store_server):
        assert_built_by_core(path, answer)
    for path in ("/api/tags", "/v1/models"):  # no key: BearerAuth answers first
        answer = httpx.get(store_server + path)
        assert answer.status_code == 401
        assert_built_by_core(path, answer)
        assert path == "/api/tags" or answer.json()["error"]["code"] == "invalid_api_key"


def test_a_pinned_pair_refuses_in_the_same_bodies(tiny_models):
    # a pinned pair answers every name: only what does not depend on the model is refused alike
    alike = [r for r in REFUSALS if not r[0].startswith(("route", "store route: no such", "store route: copy"))]
    alike.append(("body check: too large", "POST", "/v1/embeddings", b"[" + b" " * 70_000 + b"]", 413))
    with serving_tiny_pair(tiny_models, max_body_bytes=64 * 1024) as (url, _):
        for _, path, answer in answers(url, alike, headers={}):
            assert_built_by_core(path, answer)


def test_the_same_refusal_reads_the_same_on_every_route(store_server):
    """A model that is not in the store, asked of a model route and of a store route: the same words."""
    chat = httpx.post(store_server + "/api/chat", json={"model": "nope"} | CHAT, headers=AUTH)
    show = httpx.post(store_server + "/api/show", json={"model": "nope"}, headers=AUTH)
    delete = httpx.request("DELETE", store_server + "/api/delete", json={"model": "nope"}, headers=AUTH)
    assert {chat.status_code, show.status_code, delete.status_code} == {404}
    assert {tuple(a.json()) for a in (chat, show, delete)} == {("error",)}
    assert all("nope" in a.json()["error"] and "not found" in a.json()["error"] for a in (chat, show, delete))


def test_a_daemon_that_is_down_answers_in_the_one_body_too(tiny_store):
    with running_store(tiny_store, upstream=f"http://127.0.0.1:{closed_port()}", no_draft=True) as (url, _):
        forwarded = [
            ("POST", "/api/chat", {"model": "qwen3:8b"} | CHAT),
            ("POST", "/v1/chat/completions", {"model": "qwen3:8b"} | CHAT),
            ("DELETE", "/api/delete", {"model": "qwen3:8b"}),  # not ours: `ollama rm` goes on to the daemon
            ("POST", "/api/create", {"model": "x"}),
        ]
        for method, path, body in forwarded:
            answer = httpx.request(method, url + path, json=body, timeout=60)
            assert answer.status_code == 502, (path, answer.text)
            assert_built_by_core(path, answer)
            message = answer.json()["error"]
            assert "does not answer" in (message["message"] if path.startswith("/v1/") else message)
        openai = httpx.post(url + "/v1/chat/completions", json={"model": "qwen3:8b"} | CHAT, timeout=60)
        assert openai.json()["error"]["type"] == "server_error"  # as OpenAI types a server's failure
