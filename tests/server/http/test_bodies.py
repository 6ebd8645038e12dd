"""Every route of the app, with every kind of malformed body, answers a one-line 4xx JSON error and never a 500:
a pinned pair, the store, and the store in front of an upstream daemon (where the body is checked before
anything is forwarded). The routes are listed from the app's own router, so a new route is walked too."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from starlette.routing import Route

from ollama_spec.server.http.app import create_app
from tests.serving import running_store, serving_tiny_pair
from tests.upstream_daemon import UpstreamDaemon

DEEP = 100_000


def nested(depth: int) -> bytes:
    return b'{"a":' * depth + b"1" + b"}" * depth


# (what, body): each one a body no route may take, as the fault run sent them
MALFORMED = [
    ("deep arrays", b"[" * DEEP + b"]" * DEEP),
    ("deep objects", nested(DEEP)),
    ("deep inside a request", b'{"model": "qwen3:8b", "messages": ' + b"[" * DEEP + b"]" * DEEP + b"}"),
    ("deep past the limit", b'{"model": "m", "format": ' + nested(150) + b"}"),
    ("unterminated deep", b"[" * DEEP),
    ("deep with a surrogate", b'{"model": "m", "prompt": "\\ud800", "x": ' + b"[" * DEEP + b"]" * DEEP + b"}"),
    ("a 5000-digit number", b'{"model": "m", "keep_alive": ' + b"9" * 5000 + b"}"),
    ("past a float", b'{"model": "m", "options": {"temperature": 1e400}}'),
    ("NaN", b'{"model": "m", "temperature": NaN, "keep_alive": NaN}'),
    ("Infinity", b'{"model": "m", "keep_alive": -Infinity}'),
    ("an array", b"[1, 2]"),
    ("a string", b'"model"'),
    ("null", b"null"),
    ("a number", b"5"),
    ("truncated", b'{"model": "m", "messages": ['),
    ("invalid UTF-8", b'{"model": "m\xff\xfe"}'),
    ("a surrogate in UTF-8 bytes", b'{"model": "m", "prompt": "\xed\xa0\x80"}'),
    (
        "a lone surrogate escape",
        b'{"model": "m", "prompt": "\\ud800", "messages": [{"role": "user", "content": "\\udfff"}]}',
    ),
    ("a surrogate in a key", b'{"model": "m", "\\ud800": 1}'),
    ("a BOM", b'\xef\xbb\xbf{"model": "m"}'),
    (
        "wrong types",
        json.dumps(
            {
                "model": 5,
                "name": [],
                "messages": "x",
                "prompt": {},
                "input": {"a": 1},
                "options": [],
                "keep_alive": {},
                "stream": "yes",
                "source": 1,
                "destination": [],
                "insecure": "no",
            }
        ).encode(),
    ),
]
READ_ON_GET = ("/api/show",)  # the GET routes that read a body; the others ignore a well-formed one
CATCH_ALL = ("/api/create", "/api/nothing")  # the routes no other route answers: 501 and 404, never forwarded here


def app_routes(state) -> list[tuple[str, str]]:
    """(method, path) of every route the app serves, from its router; a path's parameters filled in."""
    walked = []
    for route in _flat(create_app(state).router.routes):
        for method in sorted(route.methods - {"HEAD"}):  # HEAD answers carry no body to read the error from
            if "{action:path}" in route.path:
                walked += [(method, path) for path in CATCH_ALL]
            else:
                walked.append((method, re.sub(r"\{[^}]*\}", "tiny-target:latest", route.path)))
    assert len(walked) > 20 and ("POST", "/api/chat") in walked and ("GET", "/v1/models/tiny-target:latest") in walked
    return walked


def _flat(routes) -> list[Route]:
    """The routes, those of included routers in their place (FastAPI keeps an included router whole)."""
    flat = []
    for route in routes:
        included = getattr(route, "original_router", None)
        flat += _flat(included.routes) if included is not None else [route]
    assert all(isinstance(route, Route) for route in flat), flat
    return flat


def error_text(answer: httpx.Response) -> str:
    doc = answer.json()
    error = doc["error"]
    return error["message"] if isinstance(error, dict) else error


def walk(url: str, state, skip=()) -> list[str]:
    """Every malformed body on every route (8 at a time); what went wrong, one line each."""
    cases = [
        (method, path, what, body)
        for method, path in app_routes(state)
        if path not in skip
        for what, body in MALFORMED
        # well-formed JSON: a route that reads no body has nothing to refuse
        if not (what == "wrong types" and method == "GET" and path not in READ_ON_GET)
    ]
    with httpx.Client(base_url=url, timeout=60) as client, ThreadPoolExecutor(8) as pool:
        found = pool.map(lambda case: _wrong(client, *case), cases)
        return [line for line in found if line is not None]


def _wrong(client: httpx.Client, method: str, path: str, what: str, body: bytes) -> str | None:
    """What is wrong with the answer to one malformed body, or None."""
    try:
        answer = client.request(method, path, content=body)
    except httpx.HTTPError as exc:  # the fault run saw connections reset
        return f"{method} {path} with {what}: {type(exc).__name__} {exc}"
    where = f"{method} {path} with {what}: {answer.status_code}"
    expected = (404, 501) if path in CATCH_ALL else range(400, 500)
    if answer.status_code not in expected:
        return f"{where} {answer.text[:200]!r}"
    try:
        message = error_text(answer)
    except (ValueError, KeyError, TypeError):
        return f"{where}: not a JSON error: {answer.text[:200]!r}"
    if not isinstance(message, str) or "\n" in message or "Traceback" in message or not message:
        return f"{where}: {message!r}"
    return None


@pytest.fixture(scope="module")
def pinned(tiny_models):
    with serving_tiny_pair(tiny_models) as served:
        yield served


def test_every_route_refuses_every_malformed_body_pinned(pinned):
    url, state = pinned
    assert walk(url, state) == []
    assert httpx.get(url + "/health", timeout=10).status_code == 200  # and it keeps serving


BIG = 10**30  # past 64 bits: what no integer field of either API holds
USER = [{"role": "user", "content": "Hi"}]
# well-formed requests with a number past what its field can mean: a 4xx or an answer, never a 500
HUGE_NUMBERS = [
    ("/api/generate", {"prompt": "Hi", "options": {name: BIG, "num_predict": 2}})
    for name in ("seed", "num_ctx", "top_k", "repeat_last_n", "temperature", "top_p", "min_p", "repeat_penalty")
] + [
    ("/api/generate", {"prompt": "Hi", "options": {"num_predict": BIG}, "stream": False}),
    ("/api/generate", {"prompt": "Hi", "options": {"num_predict": 2}, "context": [BIG]}),
    ("/api/generate", {"prompt": "Hi", "options": {"num_predict": 2}, "top_logprobs": BIG, "logprobs": True}),
    ("/api/chat", {"messages": USER, "options": {"num_predict": 2, "presence_penalty": BIG}}),
    ("/api/embed", {"input": "Hi", "dimensions": BIG}),
    ("/api/embed", {"input": "Hi", "dimensions": -BIG}),
    ("/v1/embeddings", {"input": [BIG]}),
    ("/v1/embeddings", {"input": "Hi", "dimensions": BIG}),
    *(
        ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, name: BIG})
        for name in ("seed", "n", "top_k", "top_logprobs", "temperature")
    ),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": BIG}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "logit_bias": {"5": BIG}}),
    ("/v1/chat/completions", {"messages": USER, "max_tokens": 2, "logit_bias": {str(BIG): 1}}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "logprobs": BIG}),
    ("/v1/completions", {"prompt": "Hi", "max_tokens": 2, "best_of": BIG}),
    ("/v1/completions", {"prompt": [BIG], "max_tokens": 2}),
    ("/v1/responses", {"input": "Hi", "max_output_tokens": BIG}),
]


def test_numbers_past_their_fields_are_refused_or_answered_never_a_500(pinned):
    wrong = []
    for path, body in HUGE_NUMBERS:
        answer = httpx.post(pinned[0] + path, json={"model": "m", "stream": False} | body, timeout=60)
        if answer.status_code >= 500 or (answer.status_code >= 400 and "\n" in error_text(answer)):
            wrong.append(f"{path} {body}: {answer.status_code} {answer.text[:200]}")
    assert wrong == []


def test_every_route_refuses_every_malformed_body_from_the_store(store_copy):
    with running_store(store_copy, no_draft=True) as (url, state):
        assert walk(url, state) == []
        assert state.loaded() == []  # nothing malformed loaded a model


def test_every_malformed_body_is_refused_before_it_is_forwarded(store_copy):
    daemon = UpstreamDaemon(tags=["qwen3:8b"])
    try:
        with running_store(store_copy, no_draft=True, upstream=daemon.url) as (url, state):
            assert walk(url, state, skip=CATCH_ALL) == []  # the catch-all's paths go to the daemon unread
            forwarded = [a for a in daemon.asked if a.method != "GET"]
            assert forwarded == []  # nothing malformed reached the daemon
    finally:
        daemon.close()


# --- the check itself ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body, depth",
    [(b"{}", 1), (b'{"a": "[[[[{{"}', 1), (b'{"a": "\\"[[", "b": [[]]}', 3), (b"[" * 7 + b"]" * 7, 7)],
)
def test_nesting_counts_brackets_outside_strings(body, depth):
    from ollama_spec.server.http.bodies import nesting

    assert nesting(body) == depth


def test_nesting_at_the_limit_is_taken():
    from ollama_spec.server.http.bodies import MAX_NESTING, Malformed, checked_body

    inner = nested(MAX_NESTING - 1)
    assert checked_body(b'{"format": ' + inner + b"}")["format"]["a"]
    with pytest.raises(Malformed, match="more than 100 deep"):
        checked_body(b'{"format": {"x": ' + inner + b"}}")


@pytest.mark.parametrize("depth", [150, 900, 5000])
def test_deep_json_inside_a_calls_arguments_text_is_taken_as_text(pinned, depth):
    """OpenAI's history gives a call's arguments as JSON text, which the body's check cannot see into."""
    arguments = '{"a":' * depth + "1" + "}" * depth
    call = {"id": "1", "type": "function", "function": {"name": "f", "arguments": arguments}}
    messages = [
        *USER,
        {"role": "assistant", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "1", "content": "x"},
    ]
    answer = httpx.post(pinned[0] + "/v1/chat/completions", json={"model": "m", "messages": messages, "max_tokens": 2})
    assert answer.status_code == 200, answer.text
