"""Both APIs take one path to a pair (ServerState.prepare_each): what a request asks is checked as far as it
can be before its model loads, so a bad request loads nothing; and a prompt longer than the loaded context
loads the model again with one that holds it, on OpenAI's routes as on Ollama's. A live server over the
store, loading the tiny models."""

import pytest

from tests.serving import get, post, running_store

USER = [{"role": "user", "content": "Once upon"}]
MISSING = {"$ref": "#/definitions/missing"}  # a schema no grammar can be made from
BAD_TOOLS = [{"type": "function", "function": {"name": ""}}]


def loaded(url: str) -> list[str]:
    return [m["name"] for m in get(url + "/api/ps").json()["models"]]


@pytest.mark.parametrize(
    ("path", "body", "words"),
    [
        ("/v1/completions", {"prompt": []}, "prompt is empty"),
        ("/v1/completions", {"prompt": [1, 2], "suffix": "end"}, "suffix needs the prompt as text"),
        ("/v1/completions", {"prompt": "Once", "max_tokens": 0}, "max_tokens must be at least 1"),
        ("/v1/chat/completions", {"messages": USER, "max_tokens": 0}, "max_tokens must be at least 1"),
        ("/v1/chat/completions", {"messages": USER, "tools": BAD_TOOLS}, "each tool must be"),
        ("/api/chat", {"messages": USER, "format": MISSING}, "cannot constrain the output"),
        ("/api/chat", {"messages": USER, "tools": BAD_TOOLS}, "each tool must be"),
        ("/api/generate", {"prompt": "Once", "template": "{{ .Prompt }}", "suffix": "end"}, "template or suffix"),
    ],
)
def test_a_bad_request_is_refused_before_its_model_loads(tiny_store, path, body, words):
    with running_store(tiny_store, no_draft=True) as (url, _):
        answer = post(url + path, json={"model": "tiny-alien", "stream": False} | body)
        assert answer.status_code == 400, answer.text
        error = answer.json()["error"]
        assert words in (error if isinstance(error, str) else error["message"])
        assert loaded(url) == []


def test_a_completion_longer_than_the_loaded_context_loads_a_larger_one(tiny_store):
    """tiny-alien, trained on 8192 tokens, loads at Ollama's 4096; a 5000-token prompt to /v1/completions
    loads it again at 8192, as /api/chat and /v1/chat/completions do, instead of a 400."""
    with running_store(tiny_store, no_draft=True) as (url, _):
        body = {"model": "tiny-alien", "max_tokens": 2, "temperature": 0}
        assert post(url + "/v1/completions", json=body | {"prompt": "Once"}).status_code == 200
        assert [m["context_length"] for m in get(url + "/api/ps").json()["models"]] == [4096]
        answer = post(url + "/v1/completions", json=body | {"prompt": [5] * 5000})
        assert answer.status_code == 200, answer.text
        assert answer.json()["usage"]["prompt_tokens"] == 5000
        assert [m["context_length"] for m in get(url + "/api/ps").json()["models"]] == [8192]
