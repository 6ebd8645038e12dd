"""The server's bounded queue: a request past --max-queue gets a 503 with a Retry-After, embeddings
wait in the same queue as generations, and a chat template that renders forever cannot freeze the
server (it renders off the event loop, with a time limit)."""

import json
import socket
import threading
import time

import httpx
import openai
import pytest

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


def _leaving_client(url: str, path: str, body: dict) -> socket.socket:
    """A client that sends its request and will hang up without reading the answer (closed by the test)."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=10)
    payload = json.dumps(body).encode()
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def test_clients_that_leave_the_queue_give_their_places_back(engine, monkeypatch):
    """Waiting clients that hang up (streamed or not, either API) free their places at once, while the one
    slot is still busy: new requests queue instead of getting 503 "already waiting"."""
    release = threading.Event()
    real_generate = engine.generate
    held_once = threading.Event()

    def held(request, **kwargs):  # the first generation holds the slot until the test lets it go
        if not held_once.is_set():
            held_once.set()
            release.wait(60)
        return real_generate(request, **kwargs)

    monkeypatch.setattr(engine, "generate", held)
    with running_server(engine, max_queue=2) as (url, state):
        worker = state.serving.served.worker
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=60)
        answers = []

        def ask():
            answers.append(client.chat.completions.create(model="m", messages=[QUESTION], max_tokens=5))

        first = threading.Thread(target=ask)
        first.start()
        _wait_for(lambda: held_once.is_set())
        leaving = [
            _leaving_client(url, "/api/chat", {"model": "m", "messages": [QUESTION]}),
            _leaving_client(url, "/v1/chat/completions", {"model": "m", "messages": [QUESTION], "stream": True}),
        ]
        _wait_for(lambda: worker.waiting == 2)
        for sock in leaving:
            sock.close()
        _wait_for(lambda: httpx.get(url + "/health").json()["waiting"] == 0)
        later = [threading.Thread(target=ask) for _ in range(2)]
        try:
            for thread in later:
                thread.start()
            _wait_for(lambda: worker.waiting == 2 or not all(t.is_alive() for t in later))
        finally:
            release.set()
            for thread in [first, *later]:
                thread.join(60)
        assert len(answers) == 3, "a request was refused although the clients ahead had left"
        with pytest.raises(openai.APIStatusError) as refused:  # the queue still has its bound
            release.clear()
            held_once.clear()
            blocked = [threading.Thread(target=ask) for _ in range(3)]
            for thread in blocked:
                thread.start()
            try:
                _wait_for(lambda: worker.waiting == 2)
                ask()
            finally:
                release.set()
                for thread in blocked:
                    thread.join(60)
        assert refused.value.status_code == 503


def _wait_for(condition, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)
