"""`serve --upstream`'s forwarder against a stand-in Ollama daemon over real HTTP: lists merged, requests
forwarded unchanged, streams arriving piece by piece, a model unloaded there before it loads here."""

from __future__ import annotations

import asyncio
import json
import logging
import time

import httpx
import ollama
import pytest
from fastapi import FastAPI, Request

from ollama_spec.server.http.upstream import (
    LIST_LIMIT,
    PROBE_TIMEOUT,
    Upstream,
    default_upstream,
    is_own_address,
    merge_tags,
    ollama_host_url,
)
from tests.live_app import serving_app
from tests.pull_servers import closed_port
from tests.upstream_daemon import UpstreamDaemon, huge_listing


@pytest.fixture
def daemon():
    server = UpstreamDaemon(tags=["qwen3:8b", "Tiny-Target:latest"], loaded=["tiny-target:latest"])
    yield server
    server.close()


def front(base_url: str):
    """A server that forwards everything, as ollama-spec forwards what it does not serve."""
    app = FastAPI()
    upstream = Upstream(base_url)

    @app.api_route("/{path:path}", methods=["GET", "POST", "DELETE", "HEAD"])
    async def anything(request: Request):
        return await upstream.forward(request, await request.body())

    return serving_app(app)


def run(coroutine_function, base_url: str):
    async def go():
        upstream = Upstream(base_url)
        try:
            return await coroutine_function(upstream)
        finally:
            await upstream.aclose()

    return asyncio.run(go())


def test_tags_merged_ours_first_without_duplicates(daemon):
    theirs = run(lambda up: up.tags(), daemon.url)
    assert [m["name"] for m in theirs] == ["qwen3:8b", "Tiny-Target:latest"]
    ours = [{"name": "tiny-target:latest", "ours": True}, {"name": "tiny-draft:latest"}]
    merged = merge_tags(ours, theirs + [{"name": "qwen3:8b"}])
    assert [m["name"] for m in merged] == ["tiny-target:latest", "tiny-draft:latest", "qwen3:8b"]
    assert merged[0]["ours"]


def test_a_daemon_that_is_down_lists_nothing_and_says_so(caplog):
    with caplog.at_level(logging.WARNING, "ollama_spec.server"):
        assert run(lambda up: up.tags(), f"http://127.0.0.1:{closed_port()}") == []
    assert "did not list its models" in caplog.text


def test_a_chat_is_forwarded_unchanged(daemon):
    body = json.dumps({"model": "qwen3:8b", "messages": [{"role": "user", "content": "hi"}], "stream": False})
    with front(daemon.url) as url:
        answer = httpx.post(
            f"{url}/api/chat?trace=1", content=body, headers={"X-Client": "webui", "Content-Type": "application/json"}
        )
    assert answer.status_code == 200 and answer.json()["message"]["content"] == "Hello there"
    (asked,) = daemon.requests_to("/api/chat")
    assert asked.method == "POST" and asked.path == "/api/chat?trace=1" and asked.body == body.encode()
    assert asked.headers["x-client"] == "webui" and asked.headers["host"] == daemon.url.removeprefix("http://")
    with front(daemon.url) as url:
        missing = httpx.delete(f"{url}/api/nothing")
    assert missing.status_code == 404 and missing.json() == {"error": "path /api/nothing not found"}


@pytest.mark.parametrize(
    ("path", "media_type"), [("/api/chat", "application/x-ndjson"), ("/v1/chat/completions", "text/event-stream")]
)
def test_streams_arrive_piece_by_piece(daemon, path, media_type):
    pieces = []
    with front(daemon.url) as url:
        started = time.monotonic()
        with httpx.stream("POST", f"{url}{path}", json={"model": "qwen3:8b", "stream": True}, timeout=30) as answer:
            assert answer.headers["content-type"] == media_type and answer.headers["x-stand-in"] == "yes"
            for line in answer.iter_lines():
                if line:
                    pieces.append((time.monotonic() - started, line))
    assert len(pieces) == 4
    first, last = pieces[0][0], pieces[-1][0]
    assert last - first >= 2.5 * daemon.delay  # each piece came when it was made, not all at the end


def test_ollamas_client_streams_through(daemon):
    with front(daemon.url) as url:
        parts = list(ollama.Client(host=url).chat(model="qwen3:8b", messages=[], stream=True))
    assert "".join(p.message.content or "" for p in parts) == "Hello there"


def test_a_daemon_that_is_down_is_a_502_in_each_apis_shape():
    with front(f"http://127.0.0.1:{closed_port()}") as url:
        ours = httpx.post(f"{url}/api/chat", json={"model": "x"})
        openai = httpx.post(f"{url}/v1/chat/completions", json={"model": "x"})
    assert ours.status_code == 502 and "does not answer" in ours.json()["error"]
    assert openai.status_code == 502 and "does not answer" in openai.json()["error"]["message"]


def test_a_model_the_daemon_holds_is_unloaded_there_first(daemon, caplog):
    daemon.unload_lag = 0.3
    with caplog.at_level(logging.INFO, "ollama_spec.server"):
        assert run(lambda up: up.unload_if_loaded("TINY-TARGET"), daemon.url) is True
    (asked,) = daemon.requests_to("/api/generate")
    assert asked.json() == {"model": "tiny-target:latest", "keep_alive": 0}
    assert f"asked the Ollama daemon at {daemon.url} to unload tiny-target:latest" in caplog.text
    assert daemon.loaded == []
    assert run(lambda up: up.unload_if_loaded("qwen3:8b"), daemon.url) is False  # not held: nothing asked
    assert len(daemon.requests_to("/api/generate")) == 1
    assert run(lambda up: up.unload_if_loaded("x"), f"http://127.0.0.1:{closed_port()}") is False


def test_default_upstream_is_ollama_host_when_a_daemon_answers(daemon, monkeypatch):
    port = int(daemon.url.rsplit(":", 1)[1])
    assert default_upstream("127.0.0.1", 8000, {"OLLAMA_HOST": daemon.url}) == daemon.url
    assert default_upstream("127.0.0.1", 8000, {"OLLAMA_HOST": f"'{daemon.url}'"}) == daemon.url  # quoted, as Ollama
    assert default_upstream("0.0.0.0", port, {"OLLAMA_HOST": daemon.url}) is None  # ourselves
    assert default_upstream("127.0.0.1", 8000, {"OLLAMA_HOST": f"127.0.0.1:{closed_port()}"}) is None


@pytest.mark.parametrize(
    ("value", "url"),
    [
        ("", "http://127.0.0.1:11434"),
        ("0.0.0.0", "http://0.0.0.0:11434"),
        (":8080", "http://127.0.0.1:8080"),
        ("example.com:99/path", "http://example.com:99/path"),
        ("http://example.com", "http://example.com:80"),
        ("https://example.com", "https://example.com:443"),
        ("ollama.com", "https://ollama.com:443"),
        ("[::1]:5000", "http://[::1]:5000"),
        ("::1", "http://[::1]:11434"),
        ("host:notaport", "http://host:11434"),
        ('"127.0.0.1:1234"', "http://127.0.0.1:1234"),
    ],
)
def test_ollama_host_read_as_ollama_reads_it(value, url):
    assert ollama_host_url(value) == url


def test_own_address():
    assert is_own_address("http://127.0.0.1:11434", "0.0.0.0", 11434)
    assert is_own_address("http://localhost:11434", "127.0.0.1", 11434)
    assert not is_own_address("http://127.0.0.1:11434", "127.0.0.1", 8000)
    assert not is_own_address("http://gpu-box:11434", "127.0.0.1", 11434)


@pytest.mark.parametrize("stream", [False, True], ids=["content-length", "chunked"])
def test_an_answer_the_daemon_breaks_off_ends_in_an_error_here(daemon, stream, caplog):
    daemon.cut = True  # Content-Length declared and half sent / two NDJSON chunks, then the connection drops
    body = {"model": "qwen3:8b", "stream": stream}
    with caplog.at_level(logging.WARNING, "ollama_spec.server"), front(daemon.url) as url:
        with httpx.stream("POST", f"{url}/api/chat", json=body, timeout=30) as answer:
            assert answer.status_code == 200  # the status line was out before the daemon broke off
            with pytest.raises(httpx.RemoteProtocolError):
                answer.read()
        with pytest.raises(httpx.RemoteProtocolError):
            list(ollama.Client(host=url).chat(model="qwen3:8b", messages=[], stream=stream))
    assert "broke off an answer" in caplog.text


def test_headers_for_one_hop_stay_on_it_both_ways(daemon):
    daemon.answer_headers = {"Connection": "X-Daemon-Hop", "X-Daemon-Hop": "1", "X-Daemon-Kept": "2"}
    headers = {"Connection": "keep-alive, X-Client-Hop", "X-Client-Hop": "1", "X-Client": "webui"}
    headers |= {"Proxy-Authorization": "Basic x", "Keep-Alive": "timeout=5"}
    with front(daemon.url) as url:
        for stream in (False, True):
            answer = httpx.post(f"{url}/api/chat", json={"model": "qwen3:8b", "stream": stream}, headers=headers)
            assert answer.status_code == 200 and answer.headers["x-daemon-kept"] == "2"
            assert "x-daemon-hop" not in answer.headers
    for asked in daemon.requests_to("/api/chat"):
        assert asked.headers["x-client"] == "webui"
        assert not {"x-client-hop", "proxy-authorization", "keep-alive"} & set(asked.headers)
        assert asked.path == "/api/chat"  # no query: no "?" either


def test_a_huge_daemon_list_is_not_merged_and_says_why(daemon, caplog):
    daemon.tags_body = huge_listing(2 * LIST_LIMIT)
    with caplog.at_level(logging.WARNING, "ollama_spec.server"):
        assert run(lambda up: up.tags(), daemon.url) == []
    assert f"did not list its models (its answer is longer than {LIST_LIMIT >> 20} MiB)" in caplog.text


def test_a_trickling_daemon_costs_a_listing_or_a_load_its_deadline_at_most(daemon, caplog, monkeypatch):
    # the deadline and the trickle a quarter of the product's and of the other tests': the same race, 4x faster
    deadline = PROBE_TIMEOUT / 4
    monkeypatch.setattr("ollama_spec.server.http.upstream.PROBE_TIMEOUT", deadline)
    daemon.trickle = 0.0125  # seconds a byte: each read comes well inside a per-read timeout
    with caplog.at_level(logging.WARNING, "ollama_spec.server"):
        for ask in (lambda up: up.tags(), lambda up: up.unload_if_loaded("tiny-target")):
            started = time.monotonic()
            assert not run(ask, daemon.url)  # nothing listed, nothing unloaded
            assert time.monotonic() - started < deadline + 2
    assert "did not list its models (no answer in time)" in caplog.text
    assert "did not list its running models (no answer in time)" in caplog.text
