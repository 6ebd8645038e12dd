"""Embeddings from the served target: Ollama's /api/embed and /api/embeddings, OpenAI's /v1/embeddings,
through the official clients (the openai client asks for base64 unless told otherwise)."""

import httpx
import numpy as np
import ollama
import pytest
from openai import BadRequestError, OpenAI

from tests.serving import serving_tiny_pair

TEXTS = ["The cat sat on the mat.", "A cat is sitting on a mat.", "Quarterly revenue rose by four percent."]


@pytest.fixture(scope="module")
def server(tiny_models):
    with serving_tiny_pair(tiny_models) as served:
        yield served


def test_ollama_embed_as_the_docs_show(server):
    client = ollama.Client(host=server[0])
    response = client.embed(model="llama3.2", input=TEXTS)
    vectors = np.array(response.embeddings)
    width = server[1].serving.served.engine.target_model.info.embedding_length
    assert vectors.shape == (3, width)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # normalized, as Ollama returns them
    assert response.prompt_eval_count >= 3 * 5
    one = client.embed(model="llama3.2", input=TEXTS[0]).embeddings
    assert len(one) == 1 and np.allclose(one[0], vectors[0], atol=1e-5)  # the same text, the same vector
    assert not np.allclose(vectors[0], vectors[2], atol=1e-3)
    legacy = np.array(client.embeddings(model="llama3.2", prompt=TEXTS[0]).embedding)
    assert np.allclose(legacy / np.linalg.norm(legacy), vectors[0], atol=1e-5)  # the older route: as computed
    cut = client.embed(model="llama3.2", input=TEXTS[0], dimensions=8).embeddings[0]
    assert len(cut) == 8 and np.linalg.norm(cut) == pytest.approx(1.0)


def test_openai_embeddings_base64_and_float_agree(server):
    client = OpenAI(base_url=server[0] + "/v1", api_key="x")
    default = client.embeddings.create(model="text-embedding-3-small", input=TEXTS)  # base64 on the wire
    floats = client.embeddings.create(model="text-embedding-3-small", input=TEXTS, encoding_format="float")
    assert [d.index for d in default.data] == [0, 1, 2]
    assert np.allclose([d.embedding for d in default.data], [d.embedding for d in floats.data], atol=1e-6)
    assert default.usage.prompt_tokens == default.usage.total_tokens > 0


@pytest.mark.parametrize("given", [[1734, 374], [[1734, 374], [9906]], ["fine", [9906]]])
def test_token_ids_are_refused_as_ollama_refuses_them(server, given):
    """langchain-openai sends cl100k token ids by default: read as this model's own ids they would be
    other tokens, embedded without a word. Ollama answers 400 "invalid input type"; so do we."""
    client = OpenAI(base_url=server[0] + "/v1", api_key="x")
    with pytest.raises(BadRequestError, match="invalid input type"):
        client.embeddings.create(model="text-embedding-3-small", input=given)


@pytest.mark.parametrize(
    "path, body, message",
    [
        ("/api/embed", {"input": ["fine", ""]}, "empty text"),
        ("/v1/embeddings", {"input": "x", "dimensions": 100000}, "more than the model's"),
        ("/v1/embeddings", {"input": "x", "encoding_format": "hex"}, "encoding_format"),
        ("/api/embed", {"input": [1734, 374]}, "invalid input type"),  # Ollama's words
    ],
)
def test_bad_embedding_requests(server, path, body, message):
    response = httpx.post(server[0] + path, json={"model": "m"} | body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in (error if isinstance(error, str) else error["message"])


def test_too_long_a_text_is_cut_unless_asked_not_to(server):
    long_text = "word " * 3000  # more tokens than an embedding reads
    cut = httpx.post(server[0] + "/api/embed", json={"model": "m", "input": long_text}, timeout=60).json()
    assert len(cut["embeddings"]) == 1 and cut["prompt_eval_count"] <= 2048
    refused = httpx.post(
        server[0] + "/api/embed", json={"model": "m", "input": long_text, "truncate": False}, timeout=60
    )
    assert refused.status_code == 400 and "allow truncation" in refused.json()["error"]


def test_generation_still_works_beside_embeddings(server):
    client = ollama.Client(host=server[0])
    client.embed(model="m", input="hello")
    answer = client.generate(model="m", prompt="Once upon a time", options={"num_predict": 8, "temperature": 0})
    assert answer.eval_count == 8


def test_ollama_embed_reads_requests_as_ollama_does(server):
    """No input loads the model (an empty list back); a dimensions not below the vector's size is ignored."""
    for empty in ({}, {"input": ""}, {"input": []}):
        answer = httpx.post(server[0] + "/api/embed", json={"model": "m"} | empty, timeout=60)
        assert answer.status_code == 200 and answer.json() == {"model": "m", "embeddings": []}
    whole = httpx.post(server[0] + "/api/embed", json={"model": "m", "input": "x"}, timeout=60).json()["embeddings"]
    for ignored in (0, -1, 100000):
        again = httpx.post(
            server[0] + "/api/embed", json={"model": "m", "input": "x", "dimensions": ignored}, timeout=60
        ).json()["embeddings"]
        assert again == whole
