"""Refused requests as a client and an operator see them: Ollama's words for a model that does not
think, and every refusal of a generation route counted in /metrics beside the answered ones."""

import httpx
import ollama
import pytest
from openai import BadRequestError, OpenAI

from tests.serving import serving_tiny_pair

USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(tiny_models):
    with serving_tiny_pair(tiny_models) as served:
        yield served


def _count(url: str, route: str, outcome: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=60).text.splitlines():
        if line.startswith(f'ollama_spec_requests_total{{outcome="{outcome}",route="{route}"}} '):
            return float(line.split()[-1])
    return 0.0


def test_think_on_a_model_that_does_not_think_quotes_its_name_as_ollama(server):
    """Ollama: fmt.Sprintf("%q does not support thinking", req.Model) (server/routes.go)."""
    with pytest.raises(ollama.ResponseError) as refused:
        ollama.Client(host=server[0]).chat(model="m", messages=USER, think=True)
    assert refused.value.status_code == 400
    assert refused.value.error == '"tiny-target:latest" does not support thinking'


def test_refused_requests_are_counted_by_route(server):
    url = server[0]
    before = {route: _count(url, route, "refused") for route in ("/api/chat", "/v1/chat/completions", "/api/generate")}
    with pytest.raises(ollama.ResponseError):  # refused when the request is built
        ollama.Client(host=url).chat(model="m", messages=USER, think=True)
    with pytest.raises(ollama.ResponseError):  # refused by the body's model
        ollama.Client(host=url).chat(model="m", messages=USER, options={"temperature": "hot"})
    with pytest.raises(BadRequestError):
        OpenAI(base_url=url + "/v1", api_key="x").chat.completions.create(model="m", messages=USER, temperature=7)
    not_json = httpx.post(url + "/api/generate", content=b"{", headers={"content-type": "application/json"}, timeout=60)
    assert not_json.status_code == 400
    assert _count(url, "/api/chat", "refused") == before["/api/chat"] + 2
    assert _count(url, "/v1/chat/completions", "refused") == before["/v1/chat/completions"] + 1
    assert _count(url, "/api/generate", "refused") == before["/api/generate"] + 1
    answered = _count(url, "/api/chat", "length")
    ollama.Client(host=url).chat(model="m", messages=USER, options={"num_predict": 2})
    assert _count(url, "/api/chat", "length") == answered + 1  # an answer is counted once, as before
    assert _count(url, "/api/chat", "refused") == before["/api/chat"] + 2
