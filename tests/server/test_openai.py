"""The OpenAI-compatible API, driven by the official `openai` client against the real server."""

import httpx
import openai
import pytest
from openai import BadRequestError, OpenAI

from ollama_spec.engine.engine import Engine
from ollama_spec.server.serving.request import Asked
from tests.conftest import engine_settings
from tests.serving import running_server

SYSTEM = {"role": "system", "content": "You are a concise assistant."}
USER = {"role": "user", "content": "Explain the difference between a process and a thread."}


@pytest.fixture(scope="module")
def server(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        with running_server(engine, aliases=("gpt-4o-mini",)) as (url, state):
            yield url, state


@pytest.fixture
def client(server):
    return OpenAI(base_url=server[0] + "/v1", api_key="anything")


def test_chat_completion_as_the_docs_show(client):
    response = client.chat.completions.create(model="gpt-4o", messages=[SYSTEM, USER], max_tokens=400, temperature=0)
    content = response.choices[0].message.content
    assert response.object == "chat.completion" and response.model == "gpt-4o-mini"
    assert response.choices[0].message.role == "assistant" and len(content) > 20
    assert response.choices[0].finish_reason in ("stop", "length")
    usage = response.usage
    assert 0 < usage.completion_tokens <= 400 and usage.prompt_tokens > 10
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    spec = response.model_extra["speculation"]
    assert spec["draft"] == "tiny-draft:latest" and spec["num_speculative_tokens"] == 5
    assert spec["drafted_tokens"] >= spec["accepted_tokens"] > 0
    assert spec["acceptance_rate"] == pytest.approx(spec["accepted_tokens"] / spec["drafted_tokens"], abs=1e-3)


def test_streamed_chat_equals_the_whole_answer_and_ends_with_usage(client):
    whole = client.chat.completions.create(model="llama3", messages=[USER], max_tokens=60, temperature=0)
    stream = client.chat.completions.create(
        model="llama3",
        messages=[USER],
        max_tokens=60,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishing = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finishing) == 1 and finishing[0].choices[0].finish_reason == whole.choices[0].finish_reason
    assert finishing[0].model_extra["speculation"]["drafted_tokens"] > 0
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def test_streaming_without_usage_sends_none_and_ends_with_done(server):
    import httpx

    body = {"model": "m", "messages": [USER], "max_tokens": 8, "stream": True, "temperature": 0}
    lines = httpx.post(server[0] + "/v1/chat/completions", json=body, timeout=60).text.strip().split("\n\n")
    assert lines[-1] == "data: [DONE]" and all(line.startswith("data: ") for line in lines)
    assert '"usage"' not in "".join(lines)


def test_max_tokens_and_max_completion_tokens_bound_the_answer(client):
    short = client.chat.completions.create(model="m", messages=[USER], max_tokens=5, temperature=0)
    newer = client.chat.completions.create(model="m", messages=[USER], max_completion_tokens=5, temperature=0)
    assert short.usage.completion_tokens == newer.usage.completion_tokens == 5
    assert short.choices[0].finish_reason == "length"
    assert short.choices[0].message.content == newer.choices[0].message.content


def test_stop_strings_end_the_answer(client):
    full = client.chat.completions.create(model="m", messages=[USER], max_tokens=40, temperature=0)
    text = full.choices[0].message.content
    stop = text[10:13]
    cut = client.chat.completions.create(model="m", messages=[USER], max_tokens=40, temperature=0, stop=[stop, "zzzz"])
    assert cut.choices[0].message.content == text[: text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    single = client.chat.completions.create(model="m", messages=[USER], max_tokens=40, temperature=0, stop=stop)
    assert single.choices[0].message.content == cut.choices[0].message.content


def test_seeded_sampling_repeats_and_top_p_is_accepted(client):
    def sample(seed):
        return (
            client.chat.completions.create(
                model="m", messages=[USER], max_tokens=30, temperature=1.0, top_p=0.95, seed=seed
            )
            .choices[0]
            .message.content
        )

    assert sample(7) == sample(7)
    assert len({sample(7), sample(8), sample(9)}) > 1


def test_completions_continue_raw_text(client):
    response = client.completions.create(model="davinci", prompt="Once upon a time", max_tokens=20, temperature=0)
    assert response.object == "text_completion" and response.usage.completion_tokens == 20
    assert response.choices[0].finish_reason == "length"
    stream = client.completions.create(
        model="davinci", prompt="Once upon a time", max_tokens=20, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices) == response.choices[0].text


def test_models_lists_the_target_and_the_aliases(client):
    assert [m.id for m in client.models.list()] == ["tiny-target:latest", "gpt-4o-mini"]


def test_served_text_equals_generate(client, invoke, tiny_store):
    prompt = "Write a haiku about the sea."
    cli = invoke(
        "generate",
        "tiny-target",
        prompt,
        "-d",
        "tiny-draft",
        "-t",
        "0",
        "-n",
        "48",
        "--threads",
        "1",
        "--no-check",
        "--ctx",
        "2048",
        "--models-dir",
        tiny_store,
    )
    assert cli.exit_code == 0, cli.output
    served = client.chat.completions.create(
        model="tiny-target", messages=[{"role": "user", "content": prompt}], max_tokens=48, temperature=0
    )
    assert served.choices[0].message.content == cli.stdout.rstrip("\n")
    assert len(cli.stdout.strip()) > 10


def test_retrieve_a_model(client):
    model = client.models.retrieve("gpt-4o")
    assert model.id == "gpt-4o" and model.object == "model" and model.owned_by == "ollama-spec"


def test_several_choices_and_a_batch_of_prompts(client):
    response = client.chat.completions.create(model="m", messages=[USER], max_tokens=6, n=3, seed=7, temperature=1)
    assert [c.index for c in response.choices] == [0, 1, 2]
    assert len({c.message.content for c in response.choices}) > 1  # seeds 7, 8, 9: different samples
    again = client.chat.completions.create(model="m", messages=[USER], max_tokens=6, seed=8, temperature=1)
    assert again.choices[0].message.content == response.choices[1].message.content
    assert response.usage.prompt_tokens == again.usage.prompt_tokens  # one prompt, counted once
    greedy = client.chat.completions.create(model="m", messages=[USER], max_tokens=6, n=2, temperature=0)
    assert greedy.choices[0].message.content == greedy.choices[1].message.content
    assert greedy.usage.completion_tokens == 12
    batch = client.completions.create(
        model="m", prompt=["Once upon a time", "The capital of"], max_tokens=5, temperature=0, n=2
    )
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    alone = client.completions.create(model="m", prompt="The capital of", max_tokens=5, temperature=0)
    assert batch.choices[2].text == batch.choices[3].text == alone.choices[0].text
    first = client.completions.create(model="m", prompt="Once upon a time", max_tokens=5, temperature=0)
    assert batch.usage.prompt_tokens == first.usage.prompt_tokens + alone.usage.prompt_tokens
    assert batch.usage.completion_tokens == 2 * (first.usage.completion_tokens + alone.usage.completion_tokens)


def test_completions_default_to_16_tokens_and_echo_the_prompt(client):
    """OpenAI's reference: max_tokens "Defaults to 16"; echo returns the prompt before the completion."""
    short = client.completions.create(
        model="m", prompt="Once upon a time", temperature=0, extra_body={"ignore_eos": True}
    )
    assert short.usage.completion_tokens == 16 and short.choices[0].finish_reason == "length"
    echoed = client.completions.create(
        model="m", prompt="Once upon a time", temperature=0, echo=True, extra_body={"ignore_eos": True}
    )
    assert echoed.choices[0].text == "Once upon a time" + short.choices[0].text
    stream = list(
        client.completions.create(
            model="m", prompt="Once upon a time", temperature=0, echo=True, stream=True, extra_body={"ignore_eos": True}
        )
    )
    assert stream[0].choices[0].text == "Once upon a time"
    assert "".join(c.choices[0].text for c in stream if c.choices) == echoed.choices[0].text
    batch = client.completions.create(model="m", prompt=["Once", "The sea"], max_tokens=2, echo=True, best_of=1)
    assert [c.text[:4] for c in batch.choices] == ["Once", "The "]
    assert len(client.completions.create(model="m", prompt="a", max_tokens=2, n=2, best_of=2).choices) == 2


def test_with_include_usage_every_chunk_has_usage_null_but_the_last(server):
    import json

    import httpx

    for path, body in [("/v1/chat/completions", {"messages": [USER]}), ("/v1/completions", {"prompt": "Once"})]:
        body |= {"model": "m", "max_tokens": 5, "stream": True, "stream_options": {"include_usage": True}}
        lines = httpx.post(server[0] + path, json=body, timeout=60).text.strip().split("\n\n")
        chunks = [json.loads(line[6:]) for line in lines[:-1]]
        assert len(chunks) > 2 and all(c["usage"] is None for c in chunks[:-1]), path
        assert chunks[-1]["usage"]["completion_tokens"] == 5


def test_penalties_and_logit_bias_apply(client, server):
    """presence/frequency penalties change the answer; logit_bias -100 bans a token, as OpenAI's
    reference says; bad biases are a 400 naming logit_bias."""

    def completion(**extra):
        return client.completions.create(model="m", prompt="Once upon a time", max_tokens=20, temperature=0, **extra)

    plain = completion().choices[0].text
    assert completion(frequency_penalty=2.0, presence_penalty=1.0).choices[0].text != plain
    served = server[1].serving.served  # the pinned pair
    request = served.build_request(Asked(prompt="Once upon a time", raw=True, max_tokens=20, temperature=0))
    generation = served.engine.generate(request, use_draft=False)
    assert "".join(generation) == plain
    first = generation.result.tokens[0]
    request = served.build_request(
        Asked(
            prompt="Once upon a time",
            raw=True,
            max_tokens=20,
            temperature=0,
            penalties={"logit_bias": ((first, float("-inf")),)},
        )
    )
    banned = served.engine.generate(request, use_draft=False)
    expected = "".join(banned)
    assert first not in banned.result.tokens
    assert completion(logit_bias={str(first): -100}).choices[0].text == expected
    for bias, message in (
        ({"x": 1}, "keys are token ids"),
        ({"²": 1}, "keys are token ids"),
        ({"1": 101}, "values are in -100..100"),
        ({"99999999": 5}, "is not in the model's vocabulary"),
    ):
        with pytest.raises(openai.BadRequestError, match=message) as caught:
            completion(logit_bias=bias)
        assert caught.value.body["param"] == "logit_bias"


def test_nulls_in_optional_fields_are_the_defaults(server):
    """Clients that send every unset field as null (LiteLLM, generated SDKs): OpenAI reads them as unset."""
    url = server[0]
    chat = {
        "model": "m",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 4,
        "temperature": 0,
        "n": None,
        "stream": None,
        "logprobs": None,
        "stop": None,
        "tools": None,
        "ignore_eos": None,
    }
    answer = httpx.post(url + "/v1/chat/completions", json=chat, timeout=60)
    assert answer.status_code == 200 and len(answer.json()["choices"]) == 1
    completion = {"model": "m", "prompt": "Once", "max_tokens": 4, "echo": None, "n": None, "stream": None}
    assert httpx.post(url + "/v1/completions", json=completion, timeout=60).status_code == 200
    response = {"model": "m", "input": "Hi", "max_output_tokens": 4, "stream": None, "instructions": None}
    assert httpx.post(url + "/v1/responses", json=response, timeout=60).json()["object"] == "response"


def test_completions_take_prompts_as_token_ids(client, server):
    """This model's own ids, as vLLM reads them: one prompt, or several."""
    target = server[1].serving.served.engine.target
    ids = target.tokenize("Once upon a time", add_bos=target.add_bos, special=False)
    as_text = client.completions.create(model="m", prompt="Once upon a time", max_tokens=6, temperature=0)
    as_ids = client.completions.create(model="m", prompt=ids, max_tokens=6, temperature=0)
    assert as_ids.choices[0].text == as_text.choices[0].text
    batch = client.completions.create(model="m", prompt=[ids, ids[:3]], max_tokens=2, temperature=0)
    assert len(batch.choices) == 2 and batch.usage.prompt_tokens == len(ids) + 3
    with pytest.raises(BadRequestError, match="token ids must be in"):
        client.completions.create(model="m", prompt=[10**9], max_tokens=2)
