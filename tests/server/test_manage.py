"""/api/pull, /api/delete and /api/copy on a minimal app over real HTTP: a local registry, a real store,
and Ollama's own Python client."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import httpx
import ollama
import pytest
from fastapi import FastAPI

from ollama_spec.models.store import Store, StoreRoot
from ollama_spec.server.http.ollama import manage
from tests.live_app import serving_app
from tests.pull_servers import registry_alone, snapshot

LIBRARY = Path("manifests/registry.ollama.ai/library")


class State:
    """What the routes may use of the server's state, recording each call."""

    def __init__(self, models_dir: Path):
        self.models_dir = str(models_dir)
        self.calls: list[tuple] = []

    async def store_changed(self) -> None:
        self.calls.append(("store_changed",))

    async def delete(self, name: str, remove):
        self.calls.append(("delete", name))
        return remove(name)


@pytest.fixture
def store(tiny_store, tmp_path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(tiny_store, root)
    return root


@pytest.fixture
def served(store):
    app = FastAPI()
    app.include_router(manage.router)
    app.state.server = state = State(store)
    with serving_app(app) as url:
        yield SimpleNamespace(url=url, state=state, client=ollama.Client(host=url))


@pytest.fixture
def registry(tiny_store, monkeypatch):
    with registry_alone(tiny_store, monkeypatch) as server:
        yield server


def lines(response: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in response.text.splitlines()]


def test_pull_streams_progress_then_the_model_is_in_the_store(served, registry, tmp_path):
    served.state.models_dir = str(tmp_path / "empty")
    (tmp_path / "empty").mkdir()
    name = f"{registry.host}/library/tiny-draft"
    response = httpx.post(f"{served.url}/api/pull", json={"model": name, "insecure": True}, timeout=60)
    assert response.status_code == 200 and response.headers["content-type"] == "application/x-ndjson"
    events = lines(response)
    assert events[0] == {"status": "pulling manifest"} and events[-1] == {"status": "success"}
    assert any(e["status"].startswith("pulling ") and "digest" in e for e in events)
    assert served.state.calls == [("store_changed",)]
    Store(StoreRoot(tmp_path / "empty", "test")).resolve(name).model_info()


def test_pull_without_stream_answers_once(served, registry, tmp_path):
    served.state.models_dir = str(tmp_path)
    name = f"{registry.host}/library/tiny-target:latest"
    response = httpx.post(f"{served.url}/api/pull", json={"name": name, "insecure": True, "stream": False}, timeout=60)
    assert response.status_code == 200 and response.json() == {"status": "success"}
    assert ("store_changed",) in served.state.calls


def test_pull_errors_as_ollama_reports_them(served, registry, tmp_path):
    served.state.models_dir = str(tmp_path)
    missing = f"{registry.host}/library/missing"
    streamed = httpx.post(f"{served.url}/api/pull", json={"model": missing, "insecure": True}, timeout=60)
    assert streamed.status_code == 200  # the first line was out: the error is the stream's last line
    assert lines(streamed)[0] == {"status": "pulling manifest"}
    assert set(lines(streamed)[-1]) == {"error"} and "not found" in lines(streamed)[-1]["error"]
    once = httpx.post(f"{served.url}/api/pull", json={"model": missing, "insecure": True, "stream": False})
    assert once.status_code == 500 and "not found" in once.json()["error"]
    plain = httpx.post(f"{served.url}/api/pull", json={"model": f"http://{registry.host}/library/tiny-draft"})
    assert plain.status_code == 500 and "plain HTTP" in plain.json()["error"]  # before any progress: a status
    for body, words in (({"model": "bad name"}, "invalid model name"), ({}, "the name is empty")):
        answer = httpx.post(f"{served.url}/api/pull", json=body)
        assert answer.status_code == 400 and words in answer.json()["error"]
    assert served.state.calls == []
    assert not (tmp_path / "manifests").exists() or not list((tmp_path / "manifests").rglob("missing"))


@pytest.mark.parametrize(
    ("body", "status", "words"),
    [
        (b"", 400, "missing request body"),
        (b"{not json", 400, "Invalid JSON"),
        (b'{"model": 7}', 400, "model: Input should be a valid string"),
        (b"[]", 400, "invalid request body"),
    ],
)
def test_bad_bodies_are_one_line_400s(served, body, status, words):
    for method, path in (("POST", "/api/pull"), ("DELETE", "/api/delete"), ("POST", "/api/copy")):
        if path == "/api/copy" and b"model" in body:
            continue
        answer = httpx.request(method, f"{served.url}{path}", content=body)
        assert answer.status_code == status, (path, answer.text)
        assert words in answer.json()["error"] and "\n" not in answer.json()["error"]


def test_delete_unloads_then_removes_and_keeps_shared_blobs(served, store):
    target_blobs = snapshot(store / "blobs")
    answer = httpx.request("DELETE", f"{served.url}/api/delete", json={"model": "TINY-DRAFT"})
    assert answer.status_code == 200 and answer.content == b""
    assert served.state.calls == [("delete", "tiny-draft:latest"), ("store_changed",)]
    assert not (store / LIBRARY / "tiny-draft" / "latest").exists()
    assert len(snapshot(store / "blobs")) < len(target_blobs)
    Store(StoreRoot(store, "test")).resolve("tiny-target").model_info()  # its shared blobs are all there
    Store(StoreRoot(store, "test")).resolve("tiny-draft:q4_0").model_info()


def test_delete_of_an_unknown_model_is_404(served, store):
    before = snapshot(store)
    answer = httpx.request("DELETE", f"{served.url}/api/delete", json={"name": "nope"})
    assert answer.status_code == 404 and answer.json() == {"error": "model 'nope' not found"}
    assert served.state.calls == [] and snapshot(store) == before


def test_copy_then_copy_errors(served, store):
    answer = httpx.post(f"{served.url}/api/copy", json={"source": "tiny-draft", "destination": "mine/draft:v2"})
    assert answer.status_code == 200 and answer.content == b""
    assert served.state.calls == [("store_changed",)]
    Store(StoreRoot(store, "test")).resolve("mine/draft:v2").model_info()
    missing = httpx.post(f"{served.url}/api/copy", json={"source": "nope", "destination": "x"})
    assert missing.status_code == 404 and missing.json() == {"error": 'model "nope" not found'}
    invalid = httpx.post(f"{served.url}/api/copy", json={"source": "tiny-draft", "destination": "a b"})
    assert invalid.status_code == 400 and invalid.json() == {"error": 'destination "a b" is invalid'}
    assert served.state.calls == [("store_changed",)]


def test_ollamas_own_client(served, registry, tmp_path):
    client = served.client
    served.state.models_dir = str(tmp_path)
    name = f"{registry.host}/library/tiny-draft:latest"
    parts = list(client.pull(name, insecure=True, stream=True))
    assert parts[0].status == "pulling manifest" and parts[-1].status == "success"
    assert any(p.digest and p.total for p in parts)
    assert client.pull(name, insecure=True).status == "success"  # everything there: a quick second pull
    assert client.copy(name, "copied:v1").status == "success"
    assert client.delete(name).status == "success"
    Store(StoreRoot(tmp_path, "test")).resolve("copied:v1").model_info()  # the copy's blobs stayed
    with pytest.raises(ollama.ResponseError) as missing:
        client.delete(name)
    assert missing.value.status_code == 404
    with pytest.raises(ollama.ResponseError, match="not found"):
        list(client.pull(f"{registry.host}/library/missing", insecure=True, stream=True))
    with pytest.raises(ollama.ResponseError, match="not found"):
        client.copy("missing", "other")


def test_a_client_that_hangs_up_stops_the_pull(served, registry, tmp_path):
    served.state.models_dir = str(tmp_path)
    registry.behaviour.delay = 0.05  # the model blob would take about three seconds
    name = f"{registry.host}/library/tiny-target"
    with httpx.stream("POST", f"{served.url}/api/pull", json={"model": name, "insecure": True}, timeout=30) as answer:
        for line in answer.iter_lines():
            if json.loads(line).get("completed"):
                break
    assert registry.idle_within(1.0)  # the download was cut off, not left to finish (about three seconds)
    assert not (tmp_path / "manifests" / registry.host).exists() and served.state.calls == []
