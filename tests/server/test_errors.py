"""Bad input gets a 4xx JSON error in the called API's own format, and the server keeps serving."""

import json

import httpx
import pytest

from ollama_spec.engine.engine import Engine
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
    (
        "legacy functions",
        "/v1/chat/completions",
        chat(functions=[{"name": "f", "parameters": {}}]),
        400,
        "functions and function_call are OpenAI's deprecated names",
    ),
    ("max_tokens zero", "/v1/chat/completions", chat(max_tokens=0), 400, "max_tokens must be at least 1, got 0"),
    ("max_tokens negative", "/v1/chat/completions", chat(max_tokens=-5), 400, "max_tokens must be at least 1"),
    (
        "max_tokens beyond the context",
        "/v1/chat/completions",
        chat(max_tokens=5000),
        400,
        "max_tokens 5000 is beyond the context",
    ),
    (
        "max_completion_tokens beyond the context",
        "/v1/chat/completions",
        chat(max_completion_tokens=2048),
        400,
        "max_completion_tokens 2048 is beyond the context",
    ),
    ("empty messages", "/v1/chat/completions", chat(messages=[]), 400, "messages: List should have at least 1 item"),
    (
        "unknown role",
        "/v1/chat/completions",
        chat(messages=[{"role": "wizard", "content": "hi"}]),
        400,
        "messages.0.role",
    ),
    ("prompt longer than the context", "/v1/chat/completions", chat(messages=LONG), 400, "but the context holds 2048"),
    (
        "an image part",
        "/v1/chat/completions",
        chat(
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is this?"},
                        {"type": "image_url", "image_url": {"url": "data:,aGk="}},
                    ],
                }
            ]
        ),
        400,
        "images are not supported: the loaded models read text only",
    ),
    (
        "an audio part",
        "/v1/chat/completions",
        chat(
            messages=[
                {"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "aGk=", "format": "wav"}}]}
            ]
        ),
        400,
        "audio is not supported: the loaded models read text only",
    ),
    (
        "best_of above n",
        "/v1/completions",
        {"model": "m", "prompt": "a", "best_of": 3},
        400,
        "best_of 3 is not supported",
    ),
    (
        "echo with logprobs",
        "/v1/completions",
        {"model": "m", "prompt": "a", "echo": True, "logprobs": 1},
        400,
        "echo with logprobs is not supported",
    ),
    ("n above the bound", "/v1/chat/completions", chat(n=17), 400, "n: Input should be less than or equal to 16"),
    ("n above 1 streamed", "/v1/chat/completions", chat(n=2, stream=True), 400, "streaming gives one choice"),
    (
        "a batch of prompts streamed",
        "/v1/completions",
        {"model": "m", "prompt": ["a", "b"], "stream": True},
        400,
        "streaming gives one choice",
    ),
    (
        "too many completions",
        "/v1/completions",
        {"model": "m", "prompt": ["a"] * 5, "n": 4},
        400,
        "5 prompts times n=4 is more than 16",
    ),
    ("no prompts", "/v1/completions", {"model": "m", "prompt": []}, 400, "prompt is empty"),
    (
        "body too large",
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": "x" * MAX_BODY}]),
        413,
        f"larger than {MAX_BODY} bytes",
    ),
    ("unknown route", "/v1/nothing", chat(), 404, "Not Found"),
]


@pytest.mark.parametrize("name, path, body, status, message", OPENAI_CASES, ids=[c[0] for c in OPENAI_CASES])
def test_openai_errors(server, name, path, body, status, message):
    response = _post(server[0] + path, body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert message in error["message"] and error["type"]
    assert error["code"] is None or isinstance(error["code"], str)  # OpenAI's codes are names, never the status
    _still_serving(server[0])


@pytest.mark.parametrize("body", [chat(messages=LONG), chat(max_tokens=5000)], ids=["prompt", "max_tokens"])
def test_openai_names_a_context_overflow_as_openai_does(server, body):
    error = _post(server[0] + "/v1/chat/completions", body).json()["error"]
    assert error["code"] == "context_length_exceeded" and error["type"] == "invalid_request_error"


def test_openai_names_the_part_it_cannot_read(server):
    parts = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]
    body = chat(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": parts}])
    error = _post(server[0] + "/v1/chat/completions", body).json()["error"]
    assert error["param"] == "messages.[1].content.[1]"
    text_parts = chat(messages=[{"role": "user", "content": [{"type": "text", "text": "Hello"}]}], max_tokens=2)
    assert _post(server[0] + "/v1/chat/completions", text_parts).status_code == 200


OLLAMA_CASES = [
    ("malformed JSON", "/api/chat", b'{"model": "m", "messages": [', 400, "not valid JSON"),
    ("messages not a list", "/api/chat", chat(messages="hi"), 400, "messages"),
    (
        "options of the wrong type",
        "/api/generate",
        {"model": "m", "prompt": "hi", "options": {"num_predict": "x"}},
        400,
        'option "num_predict" must be of type integer',
    ),
    (
        "a number as text",
        "/api/generate",
        {"model": "m", "prompt": "hi", "options": {"num_predict": "5"}},
        400,
        'option "num_predict" must be of type integer',
    ),  # as Ollama: no coercion of text
    (
        "a float option as text",
        "/api/chat",
        chat(options={"temperature": "0.5"}),
        400,
        'option "temperature" must be of type float32',
    ),
    ("stop not a list", "/api/chat", chat(options={"stop": "x"}), 400, 'option "stop" must be of type array'),
    # Ollama checks an option's type, not its range (top_p 2 is read as llama.cpp reads it: off)
    (
        "an option of the wrong type",
        "/api/chat",
        chat(options={"top_p": "high"}),
        400,
        'option "top_p" must be of type float32',
    ),
    ("options not an object", "/api/chat", chat(options=[1]), 400, "options"),
    ("show without a model", "/api/show", {}, 400, "model is required"),
    (
        "keep_alive not a duration",
        "/api/generate",
        {"model": "m", "prompt": "hi", "keep_alive": "bogus"},
        400,
        'time: invalid duration "bogus"',
    ),
    ("keep_alive a bool", "/api/chat", chat(keep_alive=True), 400, "unsupported type bool"),
    (
        "num_predict zero",
        "/api/generate",
        {"model": "m", "prompt": "hi", "options": {"num_predict": 0}},
        400,
        "num_predict 0 asks for no tokens",
    ),
    ("unknown role", "/api/chat", chat(messages=[{"role": "wizard", "content": "hi"}]), 400, "messages.0.role"),
    (
        "prompt longer than the context, not truncated",
        "/api/chat",
        chat(messages=LONG, truncate=False),
        400,
        "but the context holds 2048",
    ),
    (
        "history longer than the context, not truncated",
        "/api/chat",
        chat(messages=[{"role": "user", "content": "word " * 1500}] * 2, truncate=False),
        400,
        "but the context holds 2048",
    ),
    (
        "a template that renders nothing",
        "/api/generate",
        {"model": "m", "prompt": "hi", "template": "{{ if .Prompt }}{{ end }}"},
        400,
        "the template renders an empty prompt",
    ),
    (
        "a one-token context",
        "/api/chat",
        chat(options={"num_ctx": 1}),
        400,
        "a context of 1 token leaves no room for a prompt",
    ),
    (
        "raw with system",
        "/api/generate",
        {"model": "m", "prompt": "hi", "raw": True, "system": "Be brief."},
        400,
        "raw mode does not support template, system, or context",
    ),
    (
        "raw with context",
        "/api/generate",
        {"model": "m", "prompt": "hi", "raw": True, "context": [1, 2]},
        400,
        "raw mode does not support template, system, or context",
    ),
    (
        "a template beyond the subset",
        "/api/generate",
        {"model": "m", "prompt": "hi", "template": "{{ range .Messages }}{{ .Content }}{{ end }}"},
        400,
        "template overrides are not supported beyond",
    ),
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
        ollama.Client(host=server[0]).chat(
            model="m", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 0}
        )
    assert error.value.status_code == 400 and error.value.error.startswith("num_predict 0 asks for no tokens")


def _post(url, body):
    if isinstance(body, bytes):
        return httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=60)
    return httpx.post(url, json=body, timeout=60)


def _still_serving(url):
    assert httpx.get(url + "/health").json()["status"] == "ok"
    answer = httpx.post(
        url + "/api/generate",
        json={"model": "m", "prompt": "hi", "stream": False, "options": {"num_predict": 3}},
        timeout=60,
    )
    assert answer.status_code == 200 and answer.json()["eval_count"] == 3


LONE = "a\ud800b"  # json.dumps writes it as the escape "\ud800": what a client's broken string sends
SURROGATE_CASES = [
    ("/api/generate", {"model": "m", "stream": False, "prompt": LONE}, "prompt"),
    ("/api/generate", {"model": "m", "stream": False, "prompt": "hi", "system": LONE}, "system"),
    (
        "/api/chat",
        {"model": "m", "stream": False, "messages": [{"role": "user", "content": LONE}]},
        "messages.0.content",
    ),
    ("/api/embed", {"model": "m", "input": ["fine", LONE]}, "input.1"),
    ("/api/embeddings", {"model": "m", "prompt": LONE}, "prompt"),
    ("/api/show", {"model": LONE}, "model"),
    (
        "/v1/chat/completions",
        chat(messages=[{"role": "user", "content": [{"type": "text", "text": LONE}]}]),
        "messages.0.content.0.text",
    ),
    ("/v1/completions", {"model": "m", "prompt": LONE}, "prompt"),
    ("/v1/completions", {"model": "m", "prompt": "x", "grammar": LONE}, "grammar"),
    ("/v1/embeddings", {"model": "m", "input": LONE}, "input"),
    ("/v1/responses", {"model": "m", "input": LONE}, "input"),
    ("/v1/chat/completions", chat(model=LONE), "model"),
    (
        "/v1/chat/completions",
        chat(
            tools=[
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {LONE: {"type": "string"}}},
                    },
                }
            ]
        ),
        "tools.0.function.parameters.properties",
    ),
]


@pytest.mark.parametrize("path, body, field", SURROGATE_CASES, ids=[c[2] for c in SURROGATE_CASES])
def test_a_lone_surrogate_is_a_400_naming_the_field(server, path, body, field):
    """Was a 500 with a traceback (and a closed connection) when the text met the tokenizer."""
    with httpx.Client(timeout=60) as client:  # one connection: it must stay open after the 400
        answer = client.post(server[0] + path, content=json.dumps(body))  # ensure_ascii: the escape
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        message = error["message"] if path.startswith("/v1/") else error
        assert message.startswith(f"{field}") and "lone surrogate" in message, message
        if path.startswith("/v1/"):
            assert error["param"] == field.split(".")[0]
        assert client.get(server[0] + "/health").status_code == 200
    _still_serving(server[0])


def test_a_proper_surrogate_pair_is_text(server):
    """json.dumps escapes an emoji as a pair of surrogates: that is an emoji, not an error."""
    answer = httpx.post(
        server[0] + "/api/generate",
        timeout=60,
        content=b'{"model": "m", "stream": false, '
        b'"prompt": "smile \\ud83d\\ude00 \\\\ud800", "options": {"num_predict": 2}}',
    )
    assert answer.status_code == 200, answer.text
