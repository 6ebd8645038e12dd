"""No request body ends the server process: the shapes that made llama.cpp overflow its stack while
parsing a grammar (a schema's maxLength or maxItems, a pattern's count, groups nested 20,000 deep), sent
through the clients people use, and a fuzzed set of schemas and grammars, to a real `serve` process.
Each refused shape gets a 400 naming the bound it passed; the process still answers afterwards."""

from __future__ import annotations

import json
import random

import httpx
import ollama
import openai
import pytest

from ollama_spec.llama.grammar_limits import GrammarTooLarge, check_gbnf, check_schema
from tests.serving import serve_process

PROMPT = [{"role": "user", "content": "Answer in JSON."}]


@pytest.fixture(scope="module")
def server(tiny_store):
    with serve_process(tiny_store, "tiny-target", "-d", "tiny-draft", "--ctx", "2048") as served:
        yield served


def assert_alive(server) -> None:
    url, process = server
    assert process.poll() is None, f"the server process ended with {process.returncode}"
    assert httpx.get(url + "/health", timeout=30).json()["status"] == "ok"


def nested(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth


SCHEMAS = [
    ({"type": "string", "maxLength": 30000}, "maxLength is 30,000"),
    ({"type": "object", "properties": {"s": {"type": "string", "maxLength": 300000}}}, "maxLength is 300,000"),
    ({"type": "array", "items": {"type": "integer"}, "maxItems": 100000}, "maxItems is 100,000"),
    ({"type": "string", "pattern": "^a{0,100000}$"}, "pattern repeats 100,000 times"),
]


@pytest.mark.parametrize("schema, bound", SCHEMAS)
def test_a_schema_past_a_bound_is_a_400_through_ollama(server, schema, bound):
    client = ollama.Client(host=server[0])
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat(model="tiny-target", messages=PROMPT, format=schema, options={"num_predict": 2})
    assert refused.value.status_code == 400 and bound in refused.value.error
    assert_alive(server)


@pytest.mark.parametrize("schema, bound", SCHEMAS)
def test_a_schema_past_a_bound_is_a_400_through_openai(server, schema, bound):
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="-", max_retries=0)
    form = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    with pytest.raises(openai.BadRequestError, match=bound):
        client.chat.completions.create(model="tiny-target", messages=PROMPT, response_format=form, max_tokens=2)
    assert_alive(server)


@pytest.mark.parametrize(
    "grammar, bound",
    [
        (nested(20000), "nests groups more than 1,024 deep"),
        (
            "\n".join(f"r{i} ::= r{i + 1}" for i in range(10000)) + '\nr10000 ::= "a"\nroot ::= r0',
            "more than 4,096 rules",
        ),
        ('root ::= "a"{0,100000}', "repeats an item 100,000 times"),
    ],
)
def test_a_grammar_past_a_bound_is_a_400(server, grammar, bound):
    client = openai.OpenAI(base_url=server[0] + "/v1", api_key="-", max_retries=0)
    with pytest.raises(openai.BadRequestError, match=bound):
        client.chat.completions.create(
            model="tiny-target", messages=PROMPT, max_tokens=2, extra_body={"grammar": grammar}
        )
    # as a text/plain POST, which any web page on the machine can send without a preflight
    body = json.dumps({"model": "m", "prompt": "x", "max_tokens": 2, "grammar": grammar})
    answer = httpx.post(server[0] + "/v1/completions", content=body, headers={"Content-Type": "text/plain"})
    assert answer.status_code == 400 and bound in answer.text
    assert_alive(server)


def fuzzed_grammar(rng: random.Random) -> str:
    """Deep groups, long rule chains, big repetitions and their mixtures: the shapes that reach llama.cpp's
    recursion, at sizes on both sides of the bounds."""
    depth, rules, count = (int(10 ** rng.uniform(0, 4.3)) for _ in range(3))
    item = rng.choice(['"a"', "[a-z]", '("a" | "b")', "r1"])
    body = "(" * depth + item + ")" * depth
    body += rng.choice(["", "?", "*", "+", f"{{{count}}}", f"{{0,{count}}}", f"{{{count},}}"])
    chained = [f"r{i} ::= r{i + 1}" for i in range(1, rules)] + [f'r{rules} ::= "b"']
    return "\n".join([f"root ::= {body} {rng.choice(['', 'r1'])}", *chained])


def fuzzed_schema(rng: random.Random, depth: int = 0) -> dict:
    count = int(10 ** rng.uniform(0, 4.5))
    kind = rng.choice(["string", "pattern", "array", "object"] if depth < 4 else ["string", "pattern"])
    if kind == "string":
        return {"type": "string", rng.choice(["maxLength", "minLength"]): count}
    if kind == "pattern":
        return {"type": "string", "pattern": f"^[a-c]{{{rng.randint(0, 3)},{count}}}(x|y){{{count // 7}}}$"}
    if kind == "array":
        return {"type": "array", "items": fuzzed_schema(rng, depth + 1), rng.choice(["maxItems", "minItems"]): count}
    names = [f"p{i}" for i in range(rng.randint(1, 4))]
    return {"type": "object", "properties": {n: fuzzed_schema(rng, depth + 1) for n in names}, "required": names}


def refused_here(check, value) -> bool:
    try:
        check(value)
    except GrammarTooLarge:
        return True
    return False


def test_fuzzed_grammars_and_schemas_never_end_the_server(server):
    url, _ = server
    rng = random.Random(20261203)
    answers = {200: 0, 400: 0}
    with httpx.Client(base_url=url, timeout=120) as client:
        for _ in range(40):
            grammar = fuzzed_grammar(rng)
            body = {"model": "m", "prompt": "x", "max_tokens": 2, "grammar": grammar}
            answer = client.post("/v1/completions", json=body)
            assert answer.status_code in (200, 400), answer.text[:300]
            if refused_here(check_gbnf, grammar):
                assert answer.status_code == 400 and ("at most" in answer.text or "more than" in answer.text)
            answers[answer.status_code] += 1
        for _ in range(40):
            schema = fuzzed_schema(rng)
            body = {"model": "m", "prompt": "x", "stream": False, "format": schema, "options": {"num_predict": 2}}
            answer = client.post("/api/generate", json=body)
            assert answer.status_code in (200, 400), answer.text[:300]
            if refused_here(check_schema, schema):
                assert answer.status_code == 400 and "at most 1,000 can be enforced" in answer.text
            answers[answer.status_code] += 1
    assert answers[200] >= 10 and answers[400] >= 10, answers  # both sides of the bounds were reached
    assert_alive(server)
