"""Bad input gets a 4xx JSON error in the called API's own format, and the server keeps serving."""

import httpx
import pytest

from ollama_spec.engine import Engine
from tests.conftest import engine_settings
from tests.serving import running_server

USER = [{"role": "user", "content": "Hello"}]
LONG = [{"role": "user", "content": "word " * 3000}]  # about 9,000 tokens: more than the 2,048-token context
MAX_BODY = 64 * 1024


@pytest.fixture(scope="module")
def server(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        with running_server(engine, max_body_bytes=MAX_BODY) as (url, state):
            yield url, state


def chat(**fields):
    return {"model": "m", "messages": USER} | fields


OPENAI_CASES = [
    ("malformed JSON", "/v1/chat/completions", b'{"model": "m", "messages": [', 400, "not valid JSON"),
    ("not an object", "/v1/chat/completions", [1, 2], 400, "must be a JSON object"),
    ("messages not a list", "/v1/chat/completions", chat(messages="hi"), 400, "messages"),
    ("max_tokens not a number", "/v1/chat/completions", chat(max_tokens="many"), 400, "max_tokens"),
    ("temperature not a number", "/v1/chat/completions", chat(temperature="hot"), 400, "temperature"),
    ("temperature out of range", "/v1/chat/completions", chat(temperature=-1), 400, "temperature"),
    ("missing model", "/v1/chat/completions", {"messages": USER}, 400, "model: Field required"),
    ("max_tokens zero", "/v1/chat/completions", chat(max_tokens=0), 400, "max_tokens must be at least 1, got 0"),
    ("max_tokens negative", "/v1/chat/completions", chat(max_tokens=-5), 400, "max_tokens must be at least 1"),
    ("max_tokens beyond the context", "/v1/chat/completions", chat(max_tokens=5000), 400,
     "max_tokens 5000 is beyond the context"),
    ("max_completion_tokens beyond the context", "/v1/chat/completions", chat(max_completion_tokens=2048), 400,
     "max_completion_tokens 2048 is beyond the context"),
    ("empty messages", "/v1/chat/completions", chat(messages=[]), 400, "messages: List should have at least 1 item"),
    ("unknown role", "/v1/chat/completions", chat(messages=[{"role": "wizard", "content": "hi"}]), 400,
     "messages.0.role"),
    ("prompt longer than the context", "/v1/chat/completions", chat(messages=LONG), 400,
     "but the context holds 2048"),
    ("n above the bound", "/v1/chat/completions", chat(n=17), 400, "n: Input should be less than or equal to 16"),
    ("n above 1 streamed", "/v1/chat/completions", chat(n=2, stream=True), 400, "streaming gives one choice"),
    ("a batch of prompts streamed", "/v1/completions", {"model": "m", "prompt": ["a", "b"], "stream": True}, 400,
     "streaming gives one choice"),
    ("too many completions", "/v1/completions", {"model": "m", "prompt": ["a"] * 5, "n": 4}, 400,
     "5 prompts times n=4 is more than 16"),
    ("no prompts", "/v1/completions", {"model": "m", "prompt": []}, 400, "prompt is empty"),
    ("body too large", "/v1/chat/completions", chat(messages=[{"role": "user", "content": "x" * MAX_BODY}]), 413,
     f"larger than {MAX_BODY} bytes"),
    ("unknown route", "/v1/nothing", chat(), 404, "Not Found"),
]


@pytest.mark.parametrize("name, path, body, status, message", OPENAI_CASES, ids=[c[0] for c in OPENAI_CASES])
def test_openai_errors(server, name, path, body, status, message):
    response = _post(server[0] + path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["type"]
    _still_serving(server[0])


OLLAMA_CASES = [
    ("malformed JSON", "/api/chat", b'{"model": "m", "messages": [', 400, "not valid JSON"),
    ("messages not a list", "/api/chat", chat(messages="hi"), 400, "messages"),
    ("options of the wrong type", "/api/generate", {"model": "m", "prompt": "hi", "options": {"num_predict": "x"}},
     400, "options.num_predict"),
    ("num_predict zero", "/api/generate", {"model": "m", "prompt": "hi", "options": {"num_predict": 0}}, 400,
     "num_predict must be positive"),
    ("num_predict beyond the context", "/api/chat", chat(options={"num_predict": 5000}), 400,
     "num_predict 5000 is beyond the context"),
    ("unknown role", "/api/chat", chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages.0.role"),
    ("prompt longer than the context", "/api/chat", chat(messages=LONG), 400, "but the context holds 2048"),
    ("images", "/api/generate", {"model": "m", "prompt": "hi", "images": ["aGk="]}, 400, "images are not supported"),
    ("body too large", "/api/generate", {"model": "m", "prompt": "x" * MAX_BODY}, 413, "larger than"),
]


@pytest.mark.parametrize("name, path, body, status, message", OLLAMA_CASES, ids=[c[0] for c in OLLAMA_CASES])
def test_ollama_errors(server, name, path, body, status, message):
    response = _post(server[0] + path, body)
    assert response.status_code == status, response.text
    assert message in response.json()["error"]
    _still_serving(server[0])


def test_a_chunked_body_over_the_limit_is_refused_too(server):
    def chunks():
        yield b'{"model": "m", "prompt": "'
        for _ in range(MAX_BODY // 1024 + 1):
            yield b"x" * 1024
        yield b'"}'

    response = httpx.post(server[0] + "/api/generate", content=chunks(), timeout=60)
    assert response.status_code == 413 and "larger than" in response.json()["error"]


def test_the_ollama_client_raises_the_message(server):
    import ollama

    with pytest.raises(ollama.ResponseError) as error:
        ollama.Client(host=server[0]).chat(model="m", messages=[{"role": "user", "content": "hi"}],
                                           options={"num_predict": 0})
    assert error.value.status_code == 400 and error.value.error.startswith("num_predict must be positive")


def _post(url, body):
    if isinstance(body, bytes):
        return httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=60)
    return httpx.post(url, json=body, timeout=60)


def _still_serving(url):
    assert httpx.get(url + "/health").json()["status"] == "ok"
    answer = httpx.post(url + "/api/generate", json={"model": "m", "prompt": "hi", "stream": False,
                                                     "options": {"num_predict": 3}}, timeout=60)
    assert answer.status_code == 200 and answer.json()["eval_count"] == 3
