"""The counts a front-end shows, through the real clients: the draft's tokens in OpenAI's
`completion_tokens_details` (Open WebUI's info tooltip reads them from a /v1 connection), counted only
as far as the answer goes, and the prompt's cached tokens apart from the evaluated ones."""

import json

import httpx
import ollama
import pytest
from openai import OpenAI

from ollama_spec.decoding.loop import SpeculationSettings, SpeculationStats
from ollama_spec.engine.engine import Engine
from tests.conftest import engine_settings
from tests.serving import running_server, serving_tiny_pair

K = 8  # the same model drafts for itself: every draft is accepted, a step gives K + 1 tokens
ASK = [{"role": "user", "content": "Count with me"}]


@pytest.fixture(scope="module")
def server(tiny_models):
    with Engine(tiny_models[0], tiny_models[0], engine_settings()) as engine:
        with running_server(engine, speculation=SpeculationSettings(num_speculative_tokens=K)) as served:
            yield served


def _details(usage) -> tuple[int, int]:
    details = usage.completion_tokens_details
    return details.accepted_prediction_tokens, details.rejected_prediction_tokens


@pytest.mark.parametrize(("limit", "from_draft"), [(5, 3), (12, 9)])
def test_an_answer_cut_inside_a_step_counts_only_the_drafts_it_keeps(server, limit, from_draft):
    """max_tokens ends the answer: no step drafts past its end (each step adds the target's own token
    to its accepted drafts), and no draft past it is counted as accepted or drafted for it."""
    client = OpenAI(base_url=server[0] + "/v1", api_key="x")
    response = client.chat.completions.create(model="m", messages=ASK, max_tokens=limit, temperature=0)
    spec = response.model_extra["speculation"]
    assert response.usage.completion_tokens == limit
    # the first token comes from reading the prompt, then K drafts and the target's own token a step,
    # the last step drafting only what is left to write
    assert spec["accepted_tokens"] == spec["drafted_tokens"] == from_draft
    assert _details(response.usage) == (from_draft, 0)


def test_the_streamed_usage_chunk_carries_the_drafts_too(server):
    client = OpenAI(base_url=server[0] + "/v1", api_key="x")
    chunks = list(
        client.chat.completions.create(
            model="m", messages=ASK, max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True}
        )
    )
    usage = chunks[-1].usage
    assert usage.completion_tokens == 6 and _details(usage) == (4, 0)  # the prompt's token, 4 drafts, 1 own
    spec = next(c.model_extra["speculation"] for c in chunks if c.model_extra.get("speculation"))
    assert spec["accepted_tokens"] == 4


def _open_webui_chat(url: str, messages: list[dict]) -> dict:
    """/api/chat as Open WebUI sends it (streamed, options beside the messages): its final object."""
    body = {"model": "m", "messages": messages, "stream": True, "options": {"num_predict": 6, "temperature": 0}}
    lines = httpx.post(url + "/api/chat", json=body, timeout=60).text.splitlines()
    return json.loads(lines[-1])


def test_ollama_counts_the_answer_s_drafts_and_the_cached_prompt_apart(server):
    messages = [{"role": "user", "content": "Tell me a story about a cat"}]
    first = ollama.Client(host=server[0]).chat(model="m", messages=messages, options={"num_predict": 6})
    assert first.eval_count == 6
    final = _open_webui_chat(server[0], messages)
    spec = final["speculation"]
    assert final["eval_count"] == 6 and spec["accepted_tokens"] == spec["drafted_tokens"] == 4
    # the same prompt again: the cache holds all of it but its last token, which is read again
    assert final["prompt_eval_count"] == first.prompt_eval_count  # the whole prompt, as Ollama counts it
    assert final["prompt_eval_cached_count"] == final["prompt_eval_count"] - 1 == spec["prompt_cached_tokens"]


def test_llama_server_timings_give_the_rate_of_the_evaluated_prompt(server):
    """Open WebUI merges llama-server's `timings` into the usage it shows (its "# llama.cpp" branch):
    its prompt tokens/s there is over the tokens evaluated, not the cached ones (it read 21,823 tok/s
    from prompt_eval_count on a cache hit)."""
    client = OpenAI(base_url=server[0] + "/v1", api_key="x")
    messages = [{"role": "user", "content": "Tell me a story about a dog"}]
    client.chat.completions.create(model="m", messages=messages, max_tokens=3, temperature=0)
    chunks = list(
        client.chat.completions.create(
            model="m",
            messages=messages,
            max_tokens=3,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    timings = next(c.model_extra["timings"] for c in chunks if c.model_extra.get("timings"))
    usage = chunks[-1].usage
    assert timings["cache_n"] == usage.prompt_tokens_details.cached_tokens == usage.prompt_tokens - 1
    assert timings["prompt_n"] == 1 and timings["predicted_n"] == usage.completion_tokens == 3
    assert timings["prompt_per_second"] == pytest.approx(1000 / timings["prompt_ms"], rel=0.01)
    assert timings["draft_n_accepted"] == usage.completion_tokens_details.accepted_prediction_tokens


def test_a_pair_that_rejects_never_counts_more_accepted_than_generated(tiny_models):
    """The tiny target drafted by another model: drafts are rejected, and the answer's counts stay
    within it whatever its length cuts."""
    with serving_tiny_pair(tiny_models, speculation=SpeculationSettings(num_speculative_tokens=K)) as (url, _):
        client = OpenAI(base_url=url + "/v1", api_key="x")
        for limit in (3, 7, 16):
            response = client.chat.completions.create(model="m", messages=ASK, max_tokens=limit, temperature=0)
            spec, (accepted, rejected) = response.model_extra["speculation"], _details(response.usage)
            assert accepted == spec["accepted_tokens"] <= response.usage.completion_tokens <= limit
            assert rejected == spec["drafted_tokens"] - accepted >= 0


def test_keep_drops_the_last_step_s_drafts_past_the_answer():
    stats = SpeculationStats()
    stats.record(0, 0)  # the prompt's pass: one token
    stats.record(4, 2, 4, "draft")  # two drafts accepted, the third rejected: three tokens
    stats.record(6, 6, 6, "draft")  # all six accepted: seven tokens, of which the answer keeps two
    stats.generated = 11
    stats.keep(6)
    assert (stats.drafted, stats.accepted, stats.rejections, stats.generated) == (6, 4, 1, 6)
    # the places only the last step drafted are gone: no position drafted 0 times (a rate of 0/0)
    assert stats.drafted_by_position == [2, 2, 1, 1] and stats.accepted_by_position == [2, 2, 0, 0]
    assert stats.accepted_by_source == {"draft": 4}
    stats.keep(6)  # once is enough: again changes nothing
    assert (stats.drafted, stats.accepted, stats.generated) == (6, 4, 6)
