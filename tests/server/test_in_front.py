"""serve --upstream against a stand-in Ollama daemon, over real HTTP: one address for both, lists merged,
what we cannot run forwarded (streams piece by piece), a model the daemon holds unloaded there first."""

from __future__ import annotations

import logging
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import ollama
import pytest

from ollama_spec.server.http.upstream import PROBE_TIMEOUT
from tests.pull_servers import closed_port
from tests.server.serving.test_scheduler import add_adapter_only
from tests.serving import get, post, running_store
from tests.upstream_daemon import UpstreamDaemon, huge_listing

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def daemon():
    server = UpstreamDaemon(tags=["qwen3:8b", "Tiny-Target:latest"])
    server.delay = 0.2
    yield server
    server.close()


def names(url: str) -> list[str]:
    return [m["name"] for m in get(url + "/api/tags").json()["models"]]


def test_lists_are_merged_ours_first_without_duplicates(tiny_store, daemon):
    with running_store(tiny_store, upstream=daemon.url, no_draft=True) as (url, _):
        listed = names(url)
        assert listed[-1] == "qwen3:8b" and listed.count("tiny-target:latest") == 1
        assert "Tiny-Target:latest" not in listed  # the daemon's spelling of ours is left out
        ours = listed[:-1]
        assert all(m.get("capabilities") for m in get(url + "/api/tags").json()["models"][:-1])
        openai = get(url + "/v1/models").json()["data"]
        assert [m["id"] for m in openai] == listed
        assert openai[-1]["owned_by"] == "ollama" and {m["owned_by"] for m in openai[:-1]} == {"ollama-spec"}
        assert ours and get(url + "/v1/models/qwen3:8b").status_code == 404  # the stand-in has no such route
        assert daemon.requests_to("/v1/models/qwen3:8b")


def test_a_model_only_the_daemon_has_is_forwarded_streams_piece_by_piece(tiny_store, daemon):
    with running_store(tiny_store, upstream=daemon.url, no_draft=True) as (url, state):
        client = ollama.Client(host=url)
        started, arrived = time.monotonic(), []
        for part in client.chat(model="qwen3:8b", stream=True, **CHAT):
            arrived.append((time.monotonic() - started, part.message.content))
        assert "".join(text for _, text in arrived) == "Hello there"
        assert arrived[-1][0] - arrived[0][0] >= 2 * daemon.delay * 0.9  # relayed as made, not at the end
        (asked,) = daemon.requests_to("/api/chat")
        assert asked.json()["model"] == "qwen3:8b" and asked.json()["messages"] == CHAT["messages"]
        whole = client.chat(model="qwen3:8b", stream=False, **CHAT)
        assert whole.message.content == "Hello there"
        sse = post(url + "/v1/chat/completions", json={"model": "qwen3:8b", "stream": True} | CHAT)
        assert sse.headers["content-type"].startswith("text/event-stream") and sse.headers["x-stand-in"] == "yes"
        assert sse.text.endswith("data: [DONE]\n\n")
        assert state.loaded() == []  # nothing loaded here for the daemon's model
        ours = post(url + "/api/chat", json={"model": "tiny-target", "stream": False} | CHAT)
        assert ours.status_code == 200 and "speculation" in ours.json()  # ours stays ours
        assert len(daemon.requests_to("/api/chat")) == 2


def test_a_model_that_cannot_run_here_goes_to_the_daemon(store_copy, tmp_path, daemon):
    add_adapter_only(store_copy, tmp_path)
    with running_store(store_copy, upstream=daemon.url, no_draft=True) as (url, _):
        answer = post(url + "/api/chat", json={"model": "adapter-only", "stream": False} | CHAT)
        assert answer.status_code == 200 and answer.json()["message"]["content"] == "Hello there"
        shown = post(url + "/api/show", json={"name": "qwen3:8b"})
        assert shown.status_code == 404 and daemon.requests_to("/api/show")  # the daemon's answer, relayed


def test_the_daemon_unloads_a_model_before_it_loads_here(tiny_store, daemon, caplog):
    daemon.loaded = ["tiny-target:latest", "qwen3:8b"]
    daemon.unload_lag = 0.3
    with caplog.at_level(logging.INFO, "ollama_spec.server"):
        with running_store(tiny_store, upstream=daemon.url, no_draft=True) as (url, _):
            answer = post(url + "/api/generate", json={"model": "TINY-TARGET", "prompt": "Once", "stream": False})
            assert answer.status_code == 200, answer.text
            (unload,) = daemon.requests_to("/api/generate")
            assert unload.json() == {"model": "tiny-target:latest", "keep_alive": 0}
            assert daemon.loaded == ["qwen3:8b"]  # waited until the daemon let go, then loaded
            assert post(url + "/api/generate", json={"model": "tiny-target", "prompt": "x", "stream": False}).is_success
            assert len(daemon.requests_to("/api/generate")) == 1  # loaded here already: not asked again
    assert "asked the Ollama daemon at" in caplog.text and "to unload tiny-target:latest" in caplog.text
    lines = caplog.text.splitlines()
    asked = next(i for i, line in enumerate(lines) if "to unload tiny-target" in line)
    assert asked < next(i for i, line in enumerate(lines) if "loaded tiny-target:latest" in line)


def test_routes_we_do_not_serve_are_forwarded(tiny_store, daemon):
    with running_store(tiny_store, upstream=daemon.url, api_key="ours") as (url, _):
        key = {"Authorization": "Bearer ours"}
        create = post(url + "/api/create?x=1", json={"model": "mine", "from": "qwen3:8b"}, headers=key)
        assert create.status_code == 404 and create.json() == {"error": "path /api/create not found"}  # the daemon's
        (asked,) = daemon.requests_to("/api/create")
        assert asked.path == "/api/create?x=1" and asked.json() == {"model": "mine", "from": "qwen3:8b"}
        assert "authorization" not in asked.headers  # our key is not the daemon's
        blob = httpx.post(url + "/api/blobs/sha256:" + "0" * 64, content=b"\x00" * 100, headers=key)
        assert blob.status_code == 404 and daemon.requests_to("/api/blobs/sha256:" + "0" * 64)[0].body == b"\0" * 100
        assert get(url + "/api/nothing-here", headers=key).json() == {"error": "path /api/nothing-here not found"}
        assert post(url + "/api/create", json={}).status_code == 401  # the key is still needed for what we forward
        assert get(url + "/api/version", headers=key).json()["ollama_spec"]  # ours stays ours


def test_delete_and_copy_of_a_model_only_the_daemon_has_go_to_it(store_copy, daemon):
    with running_store(store_copy, upstream=daemon.url, no_draft=True) as (url, state):
        client = ollama.Client(host=url)
        assert client.copy("qwen3:8b", "qwen3:mine").status == "success"
        assert client.delete("qwen3:8b").status == "success"  # `ollama rm` through our address
        assert daemon.tags == ["Tiny-Target:latest", "qwen3:mine"]
        assert "qwen3:mine" in names(url) and "qwen3:8b" not in names(url)
        with pytest.raises(ollama.ResponseError) as nobody:
            client.delete("nobody-has:this")
        assert (
            nobody.value.status_code == 404
            and daemon.requests_to("/api/delete")[-1].json()["model"] == "nobody-has:this"
        )
        asked = len(daemon.asked)
        assert client.copy("tiny-target", "tiny-copy").status == "success"  # ours stays ours, named by any spelling
        assert client.delete("TINY-COPY").status == "success"
        assert not [a for a in daemon.asked[asked:] if a.path in ("/api/copy", "/api/delete")]
        assert "tiny-target:latest" in [name for name, _ in state.listed()]


def test_without_an_upstream_unserved_routes_are_501_and_unknown_models_404(tiny_store):
    with running_store(tiny_store) as (url, _):
        create = post(url + "/api/create", json={"model": "mine"})
        assert create.status_code == 501 and "--upstream" in create.json()["error"]
        answer = post(url + "/api/chat", json={"model": "qwen3:8b"} | CHAT)
        assert answer.json() == {"error": 'model "qwen3:8b" not found, try pulling it first'}


def test_a_daemon_that_is_down_is_a_502_in_one_line(tiny_store):
    with running_store(tiny_store, upstream=f"http://127.0.0.1:{closed_port()}") as (url, _):
        answer = post(url + "/api/chat", json={"model": "qwen3:8b"} | CHAT)
        assert answer.status_code == 502 and "does not answer" in answer.json()["error"]
        openai = post(url + "/v1/chat/completions", json={"model": "qwen3:8b"} | CHAT)
        assert openai.status_code == 502 and "does not answer" in openai.json()["error"]["message"]
        assert "tiny-target:latest" in names(url)  # ours still listed


def test_a_pinned_pair_answers_every_name_and_forwards_only_unserved_routes(tiny_models, daemon):
    from ollama_spec.server.http.upstream import Upstream
    from tests.serving import serving_tiny_pair

    with serving_tiny_pair(tiny_models) as (url, state):
        state.upstream = Upstream(daemon.url)
        answer = post(url + "/api/chat", json={"model": "qwen3:8b", "stream": False} | CHAT)
        assert answer.status_code == 200 and "speculation" in answer.json()  # the pinned pair's answer
        assert names(url) == [state.serving.served.model_name]  # not merged: every name is the pair's
        assert post(url + "/api/push", json={"model": "x"}).json() == {"error": "path /api/push not found"}
        assert daemon.requests_to("/api/push") and not daemon.requests_to("/api/chat")


def test_an_answer_the_daemon_breaks_off_breaks_off_here_too(tiny_store, daemon):
    daemon.cut = True  # half a Content-Length body, or two NDJSON chunks, then the connection drops
    with running_store(tiny_store, upstream=daemon.url, no_draft=True) as (url, _):
        for stream in (False, True):
            with pytest.raises(httpx.RemoteProtocolError):
                list(ollama.Client(host=url).chat(model="qwen3:8b", stream=stream, **CHAT))
        assert get(url + "/health").status_code == 200  # the server carries on


@pytest.mark.parametrize("fault", ["huge", "trickling"])
def test_a_huge_or_trickling_daemon_list_leaves_ours_listed_in_time_and_health_answering(tiny_store, daemon, fault):
    if fault == "huge":
        daemon.tags_body = huge_listing(24 << 20)  # ~100,000 distinct models, far past the bound on what is merged
    else:
        daemon.trickle = 0.05  # seconds a byte: every read comes well inside a per-read timeout
    with running_store(tiny_store, upstream=daemon.url, no_draft=True) as (url, state):
        ours = [name for name, _ in state.listed()]
        with ThreadPoolExecutor(1) as pool:
            started = time.monotonic()
            listing = pool.submit(httpx.get, url + "/api/tags", timeout=60)
            waits = []
            while not listing.done():
                asked = time.monotonic()
                assert httpx.get(url + "/health", timeout=30).status_code == 200
                waits.append(time.monotonic() - asked)
                time.sleep(0.05)
            listed = [m["name"] for m in listing.result().json()["models"]]
            took = time.monotonic() - started
    assert sorted(listed) == sorted(ours) and "tiny-target:latest" in ours  # ours alone: no daemon model
    assert took < PROBE_TIMEOUT + 3, took  # a deadline for the whole answer, not for each read
    assert max(waits) < 2, waits  # the event loop kept answering while the list was read
