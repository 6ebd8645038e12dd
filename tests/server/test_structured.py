"""Structured output over both APIs, through the official clients: Ollama's `format` (json or a
schema), OpenAI's `response_format` (json_object, json_schema, pydantic via `parse`), a GBNF `grammar`."""

import json
from typing import Literal

import httpx
import ollama
import pytest
from openai import OpenAI
from pydantic import BaseModel

from tests.grammars import FreeStrings, ShortStrings, assert_json_strings
from tests.serving import serving_tiny_pair

SCHEMA = {
    "type": "object",
    "required": ["ok", "colour"],
    "properties": {"ok": {"type": "boolean"}, "colour": {"enum": ["red", "green", "blue"]}},
}
USER = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]


class Answer(BaseModel):
    ok: bool
    colour: Literal["red", "green", "blue"]  # a random tiny model would write a free string forever


@pytest.fixture(scope="module")
def server(tiny_models):
    with serving_tiny_pair(tiny_models) as served:
        yield served


@pytest.fixture
def ollama_client(server):
    return ollama.Client(host=server[0])


@pytest.fixture
def openai_client(server):
    return OpenAI(base_url=server[0] + "/v1", api_key="anything")


def test_ollama_format_schema_as_the_docs_show(ollama_client):
    response = ollama_client.chat(model="llama3.2", messages=USER, format=SCHEMA, options={"temperature": 0})
    answer = json.loads(response.message.content)
    assert set(answer) == {"ok", "colour"} and answer["colour"] in ("red", "green", "blue")
    parsed = Answer.model_validate_json(
        ollama_client.chat(
            model="x", messages=USER, format=Answer.model_json_schema(), options={"num_predict": 200, "seed": 1}
        ).message.content
    )
    assert isinstance(parsed.ok, bool)


def test_ollama_format_json_streams_json(ollama_client):
    parts = list(
        ollama_client.generate(
            model="x",
            prompt="A JSON object, please",
            format="json",
            stream=True,
            options={"temperature": 0, "num_predict": 30},
        )
    )
    text = "".join(p.response for p in parts)
    assert text.lstrip().startswith("{")
    if parts[-1].done_reason == "stop":
        assert isinstance(json.loads(text), dict)


def test_openai_response_format(openai_client):
    response = openai_client.chat.completions.create(
        model="gpt-4o",
        messages=USER,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}},
    )
    assert set(json.loads(response.choices[0].message.content)) == {"ok", "colour"}
    parsed = openai_client.chat.completions.parse(
        model="gpt-4o", messages=USER, response_format=Answer, seed=3, max_tokens=300
    )
    assert isinstance(parsed.choices[0].message.parsed, Answer)
    loose = openai_client.chat.completions.create(
        model="gpt-4o", messages=USER, max_tokens=20, temperature=0, response_format={"type": "json_object"}
    )
    assert loose.choices[0].message.content.lstrip().startswith("{")


def test_a_gbnf_grammar(server):
    body = {"model": "m", "messages": USER, "grammar": 'root ::= "yes" | "no"', "temperature": 0}
    answer = httpx.post(server[0] + "/v1/chat/completions", json=body, timeout=60).json()
    assert answer["choices"][0]["message"]["content"] in ("yes", "no")
    assert answer["choices"][0]["finish_reason"] == "stop"


@pytest.mark.parametrize(
    "path, body, message",
    [
        ("/v1/chat/completions", {"grammar": "root ::= nowhere"}, "not valid GBNF"),
        ("/v1/chat/completions", {"response_format": {"type": "xml"}}, "response_format.type"),
        ("/v1/chat/completions", {"response_format": {"type": "json_object"}, "grammar": 'root ::= "a"'}, "not both"),
        (
            "/v1/chat/completions",
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"$ref": "#/definitions/missing"}},
                }
            },
            "cannot constrain the output",
        ),
        ("/api/chat", {"format": "xml"}, "invalid format 'xml'"),
        ("/api/chat", {"format": ["a"]}, "format"),
    ],
)
def test_bad_output_formats_are_400s(server, path, body, message):
    response = httpx.post(server[0] + path, json={"model": "m", "messages": USER} | body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert message in (error if isinstance(error, str) else error["message"])


def test_sampled_strings_are_json_on_every_route(openai_client, ollama_client):
    """Temperature 1, a few seeds: the strings a schema asks for hold no raw control character, on each
    route a client asks for one (llama-cpp-python's converter let the tiny pair write them)."""
    free = FreeStrings.model_json_schema()
    for seed in range(10):
        chat = openai_client.chat.completions.create(
            model="m",
            messages=USER,
            temperature=1,
            seed=seed,
            max_tokens=64,
            response_format={"type": "json_schema", "json_schema": {"name": "free", "schema": free}},
        )
        choice = chat.choices[0]
        assert_json_strings(choice.message.content, choice.finish_reason == "stop", FreeStrings, seed)
        answer = ollama_client.chat(
            model="m", messages=USER, format=free, options={"temperature": 1, "seed": seed, "num_predict": 64}
        )
        assert_json_strings(answer.message.content, answer.done_reason == "stop", FreeStrings, seed)
    for seed in range(4):  # short strings end, so the clients' own parsers get whole answers
        parsed = openai_client.chat.completions.parse(
            model="m", messages=USER, response_format=ShortStrings, temperature=1, seed=seed, max_tokens=200
        )
        assert isinstance(parsed.choices[0].message.parsed, ShortStrings)
        response = openai_client.responses.parse(
            model="m",
            input="A note, please",
            text_format=ShortStrings,
            temperature=1,
            max_output_tokens=200,
            extra_body={"seed": seed},
        )
        assert isinstance(response.output_parsed, ShortStrings)
