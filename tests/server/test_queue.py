"""The server's bounded queue: a request past --max-queue gets a 503 with a Retry-After, embeddings
wait in the same queue as generations, and a chat template that renders forever cannot freeze the
server (it renders off the event loop, with a time limit)."""

import threading
import time

import httpx

from ollama_spec.engine.engine import Engine
from tests.conftest import engine_settings
from tests.server.test_behaviour import (
    QUESTION,
    engine,  # noqa: F401  (the module-scoped engine fixture)
)
from tests.serving import running_server


def test_queue_is_bounded_and_answers_503(engine, monkeypatch):
    release = threading.Event()
    real_generate = engine.generate

    def held(request, **kwargs):  # the first generation waits until the test lets it go
        release.wait(30)
        return real_generate(request, **kwargs)

    monkeypatch.setattr(engine, "generate", held)
    with running_server(engine, max_queue=1) as (url, state):
        body = {"model": "m", "messages": [QUESTION], "max_tokens": 5}
        answers = []
        threads = [
            threading.Thread(
                target=lambda: answers.append(httpx.post(url + "/v1/chat/completions", json=body, timeout=60))
            )
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
            time.sleep(0.2)
        deadline = time.monotonic() + 10
        while state.serving.served.worker.waiting < 1:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        busy = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
        busy_ollama = httpx.post(url + "/api/chat", json={"model": "m", "messages": [QUESTION]}, timeout=60)
        release.set()
        for thread in threads:
            thread.join(30)
        assert busy.status_code == 503 and "--max-queue 1" in busy.json()["error"]["message"]
        assert busy_ollama.status_code == 503 and "the server is busy" in busy_ollama.json()["error"]
        for refused in (busy, busy_ollama):  # seconds, from the work ahead: two jobs of a second or more
            assert int(refused.headers["retry-after"]) >= 1
        assert [a.status_code for a in answers] == [200, 200]
        assert "ollama_spec_rejected_requests_total 2.0" in httpx.get(url + "/metrics").text


def test_embeddings_wait_in_the_same_bounded_queue(engine, monkeypatch):
    """An embedding is a job like a generation: it counts in /health's waiting and gets the same 503."""
    release = threading.Event()
    real_embed = engine.embed

    def held(*args, **kwargs):
        release.wait(30)
        return real_embed(*args, **kwargs)

    monkeypatch.setattr(engine, "embed", held)
    with running_server(engine, max_queue=1) as (url, _state):
        answers = []
        threads = [
            threading.Thread(
                target=lambda: answers.append(
                    httpx.post(url + "/api/embed", json={"model": "m", "input": "hello"}, timeout=60)
                )
            )
            for _ in range(2)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 10
        while httpx.get(url + "/health").json()["waiting"] < 1:
            assert time.monotonic() < deadline, "the second embedding never showed as waiting"
            time.sleep(0.02)
        busy = [
            httpx.post(url + "/api/embed", json={"model": "m", "input": "x"}, timeout=60),
            httpx.post(url + "/v1/embeddings", json={"model": "m", "input": "x"}, timeout=60),
            httpx.post(url + "/api/generate", json={"model": "m", "prompt": "x", "stream": False}, timeout=60),
        ]
        release.set()
        for thread in threads:
            thread.join(30)
        assert [b.status_code for b in busy] == [503, 503, 503]
        assert all(int(b.headers["retry-after"]) >= 1 for b in busy)
        assert (
            "the server is busy" in busy[0].json()["error"] and busy[1].json()["error"]["type"] == "server_overloaded"
        )
        assert [a.status_code for a in answers] == [200, 200]
        assert httpx.get(url + "/health").json()["waiting"] == 0


def test_a_chat_template_that_runs_forever_cannot_freeze_the_server(tiny_models, monkeypatch):
    """Templates render off the event loop, bounded: /health and the other routes answer meanwhile,
    and the chat gets a clear 400 when its template's time is up."""
    import dataclasses

    from tests.prompting.test_sandbox import NESTED_LOOPS

    monkeypatch.setenv("OLLAMA_SPEC_TEMPLATE_TIMEOUT", "3")
    target = tiny_models[0]
    hostile = dataclasses.replace(target, info=dataclasses.replace(target.info, chat_template=NESTED_LOOPS))
    with Engine(hostile, tiny_models[1], engine_settings()) as engine, running_server(engine) as (url, _):
        answers = []
        chat = threading.Thread(
            target=lambda: answers.append(
                httpx.post(url + "/api/chat", json={"model": "m", "stream": False, "messages": [QUESTION]}, timeout=60)
            )
        )
        chat.start()
        time.sleep(0.5)  # the template is rendering now
        started = time.monotonic()
        assert httpx.get(url + "/health", timeout=5).status_code == 200
        raw = httpx.post(
            url + "/api/generate",
            json={"model": "m", "prompt": "Hi", "raw": True, "stream": False, "options": {"num_predict": 2}},
            timeout=5,
        )
        assert raw.status_code == 200 and time.monotonic() - started < 2
        chat.join(30)
        assert answers[0].status_code == 400
        assert answers[0].json()["error"].startswith("the model's chat template took longer than 3 s to render")
