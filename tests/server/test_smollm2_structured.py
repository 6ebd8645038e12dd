"""Structured output on a real model (SmolLM2-135M-Instruct): every answer that finishes parses and
validates, through the clients people use (openai's .parse and responses.parse, ollama's format)."""

import json

import ollama
import pytest
from openai import LengthFinishReasonError, OpenAI
from pydantic import BaseModel

from ollama_spec import Engine, EngineSettings, resolve_model
from tests.serving import running_server
from tests.smollm2 import smollm2_gguf

SEEDS = range(4)
ASK = [
    {
        "role": "user",
        "content": "Invent a person: a name, an age, a city, and a motto that is a poem of two "
        "lines, one under the other, with a quote in it.",
    }
]


class Person(BaseModel):
    name: str
    age: int
    city: str
    motto: str


@pytest.fixture(scope="module")
def server():
    model = resolve_model(str(smollm2_gguf()))
    # the model drafts for itself: the speculative path runs, and a greedy answer is the model's own. One
    # thread: a token at a time is too little work to share, and two threads' spinning stalls on 2 busy cores
    with Engine(model, model, EngineSettings(n_ctx=1024, n_threads=1, memory_check=False)) as engine:
        with running_server(engine) as (url, _):
            yield url


def _finished(answers):
    """At least some answers must finish, or the test would check nothing."""
    finished = [a for a in answers if a is not None]
    assert len(finished) >= len(answers) // 2, f"only {len(finished)} of {len(answers)} answers finished"
    return finished


def test_openai_parse_validates_at_temperature_one(server):
    client = OpenAI(base_url=server + "/v1", api_key="unused")
    answers = []
    for seed in SEEDS:
        try:
            completion = client.chat.completions.parse(
                model="smollm2", messages=ASK, response_format=Person, temperature=1, seed=seed, max_tokens=160
            )
        except LengthFinishReasonError:  # cut by max_tokens: no answer to validate
            answers.append(None)
            continue
        answers.append(completion.choices[0].message.parsed)
    for person in _finished(answers):
        assert isinstance(person, Person)


def test_responses_structured_output_validates(server):
    """The Responses API's json_schema format (what responses.parse sends; parse itself raises on an
    answer cut by max_output_tokens, before its status can be read)."""
    client = OpenAI(base_url=server + "/v1", api_key="unused")
    schema = {"type": "json_schema", "name": "Person", "schema": Person.model_json_schema(), "strict": True}
    answers = []
    for seed in SEEDS[:3]:
        response = client.responses.create(
            model="smollm2",
            input=ASK,
            text={"format": schema},
            temperature=1,
            max_output_tokens=160,
            extra_body={"seed": seed},
        )
        answers.append(response.output_text if response.status == "completed" else None)
    for text in _finished(answers):
        Person.model_validate_json(text)


def test_ollama_format_schema_validates(server):
    client = ollama.Client(host=server)
    answers = []
    for seed in SEEDS:
        answer = client.chat(
            model="smollm2",
            messages=ASK,
            format=Person.model_json_schema(),
            options={"temperature": 1, "seed": seed, "num_predict": 160},
        )
        answers.append(answer.message.content if answer.done_reason == "stop" else None)
    for content in _finished(answers):
        Person.model_validate(json.loads(content))  # raises on a control character or a missing field
