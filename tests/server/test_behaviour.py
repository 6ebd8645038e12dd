"""How the server behaves: prefix reuse, one request at a time, disconnects, API keys, browsers'
origins, metrics, load, and a clean exit on SIGINT/SIGTERM. The bounded queue and templates that
never finish rendering: test_queue.py."""

import asyncio
import json
import re
import signal
import threading
import time

import httpx
import ollama
import pytest
from openai import OpenAI

from ollama_spec.engine.engine import Engine
from tests.conftest import engine_settings
from tests.serving import running_server, serve_process

QUESTION = {"role": "user", "content": "Explain the difference between a process and a thread."}


@pytest.fixture(scope="module")
def engine(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        yield engine


@pytest.fixture
def server(engine):
    with running_server(engine) as running:
        yield running


def count_evaluated(monkeypatch, model):
    """Record how many tokens each evaluation of `model` reads (one item of a pass the step loop runs)."""
    calls = []
    real = model.decode_many

    def decode_many(items):
        calls.extend(len(tokens) for _, tokens, _ in items)
        return real(items)

    monkeypatch.setattr(model, "decode_many", decode_many)
    return calls


def test_next_turn_evaluates_only_the_new_tokens(server, engine, monkeypatch):
    client = OpenAI(base_url=server[0] + "/v1", api_key="x")
    first = client.chat.completions.create(model="m", messages=[QUESTION], max_tokens=30, temperature=0)
    turn = [
        QUESTION,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And which one is cheaper to start?"},
    ]
    evaluated = count_evaluated(monkeypatch, engine.target)
    second = client.chat.completions.create(model="m", messages=turn, max_tokens=30, temperature=0)
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens  # the whole first prompt is reused, at least
    assert second.model_extra["speculation"]["prompt_cached_tokens"] == cached
    # before the first token the target reads only what follows the cached prefix
    assert evaluated[0] == second.usage.prompt_tokens - cached
    assert evaluated[0] <= second.usage.prompt_tokens - first.usage.prompt_tokens  # the first prompt is not read again

    engine.clear_cache()  # the same turn on an empty cache reads the whole prompt
    evaluated.clear()
    again = client.chat.completions.create(model="m", messages=turn, max_tokens=30, temperature=0)
    assert evaluated[0] == again.usage.prompt_tokens and again.usage.prompt_tokens_details.cached_tokens == 0
    assert again.choices[0].message.content == second.choices[0].message.content


def test_a_client_that_disconnects_stops_its_generation(engine, monkeypatch):
    real_eval = engine.target.eval
    # slow each target pass down, so that 1,900 tokens would take several seconds
    monkeypatch.setattr(engine.target, "eval", lambda tokens, **kw: time.sleep(0.01) or real_eval(tokens, **kw))
    with running_server(engine) as (url, _state):
        # greedy: a sampled answer could meet one of the model's stop strings before the client leaves
        body = {
            "model": "m",
            "messages": [QUESTION],
            "max_tokens": 1900,
            "ignore_eos": True,
            "stream": True,
            "temperature": 0,
        }
        with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as response:
            for i, _ in enumerate(response.iter_lines()):
                if i > 5:
                    break  # leave mid-stream
        start = time.monotonic()
        answer = httpx.post(url + "/v1/chat/completions", json=body | {"stream": False, "max_tokens": 3}, timeout=60)
        assert answer.status_code == 200 and time.monotonic() - start < 3  # the slot was freed at once
        metrics = httpx.get(url + "/metrics").text
    assert 'ollama_spec_requests_total{outcome="cancelled",route="/v1/chat/completions"} 1.0' in metrics
    generated = float(re.search(r"^ollama_spec_generated_tokens_total (\S+)$", metrics, re.MULTILINE).group(1))
    assert generated < 600


def test_api_key_guards_every_route_but_health(engine):
    with running_server(engine, api_key="sekret") as (url, _):
        assert httpx.get(url + "/health").status_code == 200
        refused = httpx.get(url + "/v1/models")
        assert refused.status_code == 401 and "Authorization: Bearer" in refused.json()["error"]["message"]
        # as OpenAI's API answers a bad key
        assert refused.json()["error"] | {"message": ""} == {
            "message": "",
            "type": "invalid_request_error",
            "param": None,
            "code": "invalid_api_key",
        }
        wrong = httpx.get(url + "/api/tags", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401 and isinstance(wrong.json()["error"], str)
        assert httpx.get(url + "/metrics").status_code == 401
        assert httpx.get(url + "/").status_code == 401
        assert [m.id for m in OpenAI(base_url=url + "/v1", api_key="sekret").models.list()] == ["tiny-target:latest"]
        client = ollama.Client(host=url, headers={"Authorization": "Bearer sekret"})
        assert client.generate(model="m", prompt="hi", options={"num_predict": 2}).eval_count == 2
        for scheme in ("bearer", "BEARER", "Bearer  "):  # RFC 7235: the scheme is case-insensitive
            assert httpx.get(url + "/api/tags", headers={"Authorization": f"{scheme} sekret"}).status_code == 200
        for wrong in ("sekret", "Basic sekret", "Bearer sekret2", "Bearersekret"):
            assert httpx.get(url + "/api/tags", headers={"Authorization": wrong}).status_code == 401, wrong


def preflight(url, origin):
    return httpx.options(
        url + "/api/chat",
        headers={
            "Origin": origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,authorization",
        },
    )


def test_browsers_may_call_from_this_machine_and_from_the_origins_given(engine):
    """As Ollama: pages on localhost (any port) and apps may call; other pages only with --origins."""
    with running_server(engine, api_key="sekret", origins=("https://chat.example.org",)) as (url, _):
        allowed = ("http://localhost:3000", "http://127.0.0.1:8080", "app://obsidian.md", "https://chat.example.org")
        for origin in allowed:
            answer = preflight(url, origin)  # no API key: browsers send none before the real request
            assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == origin, origin
        assert "access-control-allow-origin" not in preflight(url, "https://evil.example.com").headers
        real = httpx.get(
            url + "/api/tags", headers={"Origin": "http://localhost:3000", "Authorization": "Bearer sekret"}
        )
        assert real.status_code == 200 and real.headers["access-control-allow-origin"] == "http://localhost:3000"
    with running_server(engine, origins=("*",)) as (url, _):
        assert preflight(url, "https://anywhere.example").headers["access-control-allow-origin"] in (
            "*",
            "https://anywhere.example",
        )


def test_metrics_and_the_log_line_count_requests_and_tokens(server, caplog):
    url = server[0]
    with caplog.at_level("INFO", logger="ollama_spec.server"):
        answer = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "Hi", "max_tokens": 12}, timeout=60)
        # the count and the log line come once the answer is written (serving/worker.py, Job.take): a client
        # may read the whole answer before the event loop gets to them
        deadline = time.monotonic() + 10
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.01)
    line = caplog.records[-1].getMessage()
    assert line.startswith("/v1/completions: ") and "12 generated" in line and "finish length" in line
    assert re.search(r"drafted \d+, accepted \d+ \(\d+%\), [\d.]+ tokens per target pass", line)
    spec = answer.json()["speculation"]
    text = httpx.get(url + "/metrics").text
    values = dict(re.findall(r"^(ollama_spec_\w+(?:\{[^}]*\})?) (\S+)$", text, re.MULTILINE))
    assert float(values["ollama_spec_generated_tokens_total"]) == 12
    assert float(values["ollama_spec_drafted_tokens_total"]) == spec["drafted_tokens"]
    assert float(values["ollama_spec_accepted_tokens_total"]) == spec["accepted_tokens"]
    assert float(values["ollama_spec_prompt_tokens_total"]) == answer.json()["usage"]["prompt_tokens"]
    assert float(values['ollama_spec_requests_total{outcome="length",route="/v1/completions"}']) == 1
    assert "# TYPE ollama_spec_generated_tokens_total counter" in text


def test_fifty_concurrent_requests_all_complete_unmixed(server):
    url = server[0]
    prompts = [
        f"Tell story number {i} about a {animal}." for i, animal in enumerate(["cat", "dog", "fox", "owl", "eel"] * 10)
    ]

    def body(prompt, stream):
        return {
            "model": "m",
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 24,
            "temperature": 0,
            "stream": stream,
        }

    expected = [
        httpx.post(url + "/v1/chat/completions", json=body(p, False), timeout=60).json()["choices"][0]["message"][
            "content"
        ]
        for p in prompts
    ]
    assert len(set(expected)) > 10

    async def one(client, prompt, stream):
        if not stream:
            response = await client.post(url + "/v1/chat/completions", json=body(prompt, False))
            return response.json()["choices"][0]["message"]["content"]
        text = ""
        async with client.stream("POST", url + "/v1/chat/completions", json=body(prompt, True)) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: {"):
                    chunk = json.loads(line[6:])
                    text += "".join(c["delta"].get("content") or "" for c in chunk["choices"])
        return text

    async def all_at_once():
        async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=60)) as client:
            return await asyncio.gather(*(one(client, p, i % 2 == 0) for i, p in enumerate(prompts)))

    assert asyncio.run(all_at_once()) == expected
    assert httpx.get(url + "/health").json() == {"status": "ok", "model": "tiny-target:latest", "waiting": 0}


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_streams_and_exits_0(tiny_store, sig):
    with serve_process(tiny_store, "tiny-target", "-d", "tiny-draft", "--ctx", "16384") as (url, process):
        # Greedy: a sampled answer sometimes hit one of the model's stop strings (<|eot_id|>) within
        # 20 tokens, which ignore_eos does not lift, so the stream ended before the signal was sent. The
        # greedy one stops after 381 tokens: on a busy machine that is as few as 19 lines, each a look's
        # pieces, so the signal comes after a few.
        body = {
            "model": "m",
            "prompt": "Once",
            "max_tokens": 16000,
            "ignore_eos": True,
            "stream": True,
            "temperature": 0,
        }
        lines = []
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as response:
            for line in filter(None, response.iter_lines()):
                lines.append(line)
                if len(lines) == 4:
                    process.send_signal(sig)
        assert len(lines) > 4, f"the stream ended before the signal: {lines[-2:]}"
        assert process.wait(30) == 0
        assert lines[-1] == "data: [DONE]"
        last = json.loads([line for line in lines if line.startswith("data: {")][-1][6:])
        assert "the server is shutting down" in last["error"]["message"]  # not a finish_reason: it was cut short
        assert not any('"finish_reason": "stop"' in line for line in lines)


def test_a_taken_port_is_one_line(invoke, tiny_store):
    from ollama_spec.server.http.run import bind

    with bind("127.0.0.1", 0) as taken:
        port = taken.getsockname()[1]
        result = invoke("serve", "tiny-target", "--port", port, "--no-check", "--models-dir", tiny_store)
    assert result.exit_code == 1
    assert result.output.strip() == f"Error: cannot listen on 127.0.0.1:{port}: Address already in use"


def test_an_answer_cut_short_by_shutdown_ends_with_an_error_not_a_finish(engine, monkeypatch):
    """A client must not take a truncated answer for a finished one (the queued ones already got an error)."""
    real_eval = engine.target.eval
    monkeypatch.setattr(engine.target, "eval", lambda tokens, **kw: time.sleep(0.01) or real_eval(tokens, **kw))
    with running_server(engine) as (url, state):
        openai_body = {
            "model": "m",
            "prompt": "Once",
            "max_tokens": 1900,
            "ignore_eos": True,
            "stream": True,
            "temperature": 0,
        }
        ollama_body = {"model": "m", "prompt": "Once", "options": {"num_predict": 1900, "temperature": 0}}
        threading.Timer(0.5, state.serving.served.worker.cancel_all).start()
        whole = httpx.post(url + "/v1/completions", json=openai_body | {"stream": False}, timeout=60)
        assert whole.status_code == 503 and "shutting down" in whole.json()["error"]["message"]
        for path, body in [("/v1/completions", openai_body), ("/api/generate", ollama_body)]:
            lines = []
            with httpx.stream("POST", url + path, json=body, timeout=60) as response:
                for line in filter(None, response.iter_lines()):
                    lines.append(line)
                    if len(lines) == 5:
                        state.serving.served.worker.cancel_all()  # what SIGTERM and Ctrl-C do first
            if path == "/api/generate":
                assert "the server is shutting down" in json.loads(lines[-1])["error"]
                assert not any(json.loads(line).get("done") for line in lines)
            else:
                assert lines[-1] == "data: [DONE]" and "shutting down" in json.loads(lines[-2][6:])["error"]["message"]
                assert json.loads(lines[-2][6:])["error"]["type"] == "server_error"
                assert not any('"finish_reason": "stop"' in line for line in lines)


def test_a_models_message_history_comes_first_as_ollama_puts_it(engine, monkeypatch):
    """A Modelfile's MESSAGE lines (the manifest's messages layer) open every chat and templated
    prompt, as Ollama's handlers prepend them; raw prompts and continued contexts go without."""
    from dataclasses import replace

    from ollama_spec.prompting.messages import ChatMessage
    from ollama_spec.server import ServerSettings, ServerState
    from ollama_spec.server.serving.request import Asked

    history = (ChatMessage("user", "Ahoy"), ChatMessage("assistant", "Arr"))
    monkeypatch.setattr(engine, "target_model", replace(engine.target_model, messages=history))
    served = ServerState(engine, ServerSettings()).serving.served  # the pinned pair
    try:
        chat = served.build_request(Asked(messages=[ChatMessage("user", "Hi")]))
        assert chat.messages == (*history, ChatMessage("user", "Hi"))
        prompt = served.build_request(Asked(prompt="Hi"))
        assert prompt.messages == (*history, ChatMessage("user", "Hi"))
        assert served.build_request(Asked(prompt="Hi", raw=True)).messages == ()
    finally:
        served.worker.close()


def test_the_speculation_field_names_ngram_lookup_and_gives_its_k(baseline_engine):
    """--draft ngram speculates without a draft model: the proposer is named and its K reported, not
    null and 0 as for no speculation."""
    engine = baseline_engine
    from ollama_spec.decoding.loop import SpeculationSettings
    from ollama_spec.engine.engine import Result
    from ollama_spec.server import ServerSettings, ServerState

    for speculation, k, draft in (
        (SpeculationSettings(4, proposer="ngram"), 4, "ngram"),
        (SpeculationSettings(3), 0, None),
    ):
        served = ServerState(engine, ServerSettings(speculation=speculation)).serving.served
        try:
            assert served.summary(Result())["num_speculative_tokens"] == k
            assert served.summary(Result())["draft"] == draft
        finally:
            served.worker.close()
