"""/api/pull, /api/delete and /api/copy on a real serve over the store: the listing follows each write,
a pulled or copied model answers by its name, a deleted one is unloaded and gone, its shared blobs kept."""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone

import httpx
import ollama
import pytest

from ollama_spec.decoding.evals import Eval
from ollama_spec.engine.generation import Generation
from ollama_spec.models.store import Store, StoreRoot
from tests.pull_servers import registry_alone, snapshot
from tests.serving import get, post, running_store

CHAT = {"messages": [{"role": "user", "content": "Hi"}], "stream": False, "options": {"num_predict": 3}}


@pytest.fixture
def registry(tiny_store, monkeypatch):
    with registry_alone(tiny_store, monkeypatch) as server:
        yield server


def names(url: str) -> list[str]:
    return [m["name"] for m in get(url + "/api/tags").json()["models"]]


def test_a_pulled_model_is_listed_and_answers(store_copy, registry):
    with running_store(store_copy, no_draft=True) as (url, _):
        name = f"{registry.host}/library/tiny-target:latest"
        assert name not in names(url)
        parts = list(ollama.Client(host=url).pull(name, insecure=True, stream=True))
        assert parts[0].status == "pulling manifest" and parts[-1].status == "success"
        assert name in names(url)  # the listing was refreshed
        answer = post(url + "/api/chat", json={"model": name} | CHAT)
        assert answer.status_code == 200, answer.text
        assert name in [m["name"] for m in get(url + "/api/ps").json()["models"]]


def test_delete_unloads_keeps_shared_blobs_and_the_model_is_gone(store_copy):
    with running_store(store_copy, no_draft=True) as (url, _):
        assert post(url + "/api/chat", json={"model": "tiny-draft"} | CHAT).status_code == 200
        blobs = snapshot(store_copy / "blobs")
        ollama.Client(host=url).delete("tiny-draft")
        assert get(url + "/api/ps").json()["models"] == []  # unloaded before its files went
        assert "tiny-draft:latest" not in names(url) and "tiny-target:latest" in names(url)
        assert len(snapshot(store_copy / "blobs")) < len(blobs)
        Store(StoreRoot(store_copy, "test")).resolve("tiny-draft:q4_0").model_info()  # its blobs stayed
        assert post(url + "/api/chat", json={"model": "tiny-target"} | CHAT).status_code == 200
        gone = post(url + "/api/chat", json={"model": "tiny-draft"} | CHAT)
        assert gone.status_code == 404 and gone.json()["error"].startswith('model "tiny-draft" not found')
        again = ollama.Client(host=url)
        with pytest.raises(ollama.ResponseError) as missing:
            again.delete("tiny-draft")
        assert missing.value.status_code == 404


def test_a_copy_answers_by_its_new_name(store_copy):
    with running_store(store_copy, no_draft=True) as (url, _):
        ollama.Client(host=url).copy("tiny-target", "mine/target:v2")
        assert "mine/target:v2" in names(url)
        answer = post(url + "/api/chat", json={"model": "mine/target:v2"} | CHAT)
        assert answer.status_code == 200, answer.text
        assert [m["name"] for m in get(url + "/api/ps").json()["models"]] == ["mine/target:v2"]


def test_a_padded_name_is_refused_as_ollama_refuses_it(store_copy):
    with running_store(store_copy, no_draft=True) as (url, _):
        answer = httpx.request("DELETE", url + "/api/delete", json={"model": " tiny-draft:latest "}, timeout=30)
        assert answer.status_code == 400 and answer.json() == {"error": 'name " tiny-draft:latest " is invalid'}
        assert "tiny-draft:latest" in names(url)


def test_a_delete_on_a_read_only_store_fails_before_unloading(store_copy, monkeypatch):
    import os

    with running_store(store_copy, no_draft=True) as (url, _):
        assert post(url + "/api/chat", json={"model": "tiny-draft"} | CHAT).status_code == 200
        real_access = os.access

        def read_only(path, mode, *args, **kwargs):  # as access(2) answers on a read-only mount (EROFS)
            if mode & os.W_OK and str(path).startswith(str(store_copy)):
                return False
            return real_access(path, mode, *args, **kwargs)

        monkeypatch.setattr(os, "access", read_only)
        answer = httpx.request("DELETE", url + "/api/delete", json={"model": "tiny-draft"}, timeout=30)
        assert answer.status_code == 500 and "not writable" in answer.json()["error"]
        assert "\n" not in answer.json()["error"]
        assert [m["name"] for m in get(url + "/api/ps").json()["models"]] == ["tiny-draft:latest"]
        assert "tiny-draft:latest" in names(url)


@pytest.fixture
def held_streams(monkeypatch):
    """Each generation, once its first piece of text has been handed on, runs no further step until the
    test sets the event or its request is cancelled: its stream is running, whatever the machine's load
    and wherever its answer would end, for as long as the test needs it to."""
    let_go = threading.Event()
    real = Generation.steps

    def held(self, *, runs=False):
        steps, shown = real(self, runs=runs), False
        try:
            item = next(steps)
            while True:
                if isinstance(item, Eval):  # an evaluation: its rows go on to the steps
                    rows = yield item
                    # the loop hands a step's text on before it runs the next pass: the client has it by now
                    while shown and not let_go.wait(0.01) and not (self.stop and self.stop()):
                        pass
                    item = steps.send(rows)
                else:
                    shown = True
                    yield item
                    item = next(steps)
        except StopIteration:
            return
        finally:
            steps.close()

    monkeypatch.setattr(Generation, "steps", held)
    yield let_go
    let_go.set()  # a test that failed before letting its streams go


def _streamed_chat(url: str, model: str, num_predict: int, started: threading.Event, outcome: list) -> None:
    # greedy: the answer's first token is text, not its end (the model's default samples, by a random seed)
    options = {"num_predict": num_predict, "temperature": 0}
    chunks = ollama.Client(host=url, timeout=120).chat(
        model=model, messages=[{"role": "user", "content": "Hi"}], stream=True, options=options
    )
    try:
        for _ in chunks:
            started.set()
        outcome.append("finished")
    except ollama.ResponseError as exc:
        outcome.append(exc.error)


def test_a_delete_ends_the_running_stream_of_its_model(store_copy, held_streams):
    """As Ollama's delete: the model's running stream ends now with an error that says why, and the delete
    goes through without waiting for the stream's whole answer (held here until the test lets it go)."""
    with running_store(store_copy, no_draft=True) as (url, _):
        started, outcome = threading.Event(), []
        stream = threading.Thread(target=_streamed_chat, args=(url, "tiny-target", 100_000, started, outcome))
        stream.start()
        assert started.wait(60)
        deleted = []
        delete = threading.Thread(
            target=lambda: deleted.append(ollama.Client(host=url, timeout=120).delete("tiny-target"))
        )
        delete.start()
        delete.join(20)
        assert deleted and deleted[0].status == "success", "the delete waited for the stream"
        held_streams.set()
        stream.join(60)
        delete.join(60)
        assert len(outcome) == 1 and "is being deleted" in outcome[0], outcome
        assert "tiny-target:latest" not in names(url)
        assert get(url + "/api/ps").json()["models"] == []


def test_a_model_unloading_after_its_stream_is_listed_as_stopping(store_copy, held_streams):
    """/api/ps keeps listing a model told to unload while a stream still runs on it, with an expiry in the
    past (what `ollama ps` shows as "Stopping..."); it leaves the list when the stream ends."""
    with running_store(store_copy, no_draft=True) as (url, _):
        started, outcome = threading.Event(), []
        stream = threading.Thread(target=_streamed_chat, args=(url, "tiny-target", 400, started, outcome))
        stream.start()
        assert started.wait(60)
        assert post(url + "/api/generate", json={"model": "tiny-target", "keep_alive": 0}).status_code == 200
        listed = ollama.Client(host=url).ps().models
        held_streams.set()
        stream.join(60)
        assert [m.model for m in listed] == ["tiny-target:latest"], f"the stream's end: {outcome}"
        assert listed[0].expires_at < datetime.now(timezone.utc)
        assert outcome == ["finished"]
        deadline = time.monotonic() + 20
        while get(url + "/api/ps").json()["models"]:
            assert time.monotonic() < deadline, "the model stayed listed after its last request ended"
            time.sleep(0.05)


def test_padded_and_overlong_names_are_refused_on_copy_and_show(store_copy):
    """A name with spaces around it, or a part past Ollama's 80 characters, names no model: copy and show
    answer 400 (through Ollama's client) and the store gains nothing."""
    with running_store(store_copy, no_draft=True) as (url, _):
        client = ollama.Client(host=url)
        refusals = [
            (lambda: client.copy(" tiny-target", "mine:copy"), 'source " tiny-target" is invalid'),
            (lambda: client.copy("tiny-target", "mine:copy "), 'destination "mine:copy " is invalid'),
            (lambda: client.copy("tiny-target", "m" * 81), f'destination "{"m" * 81}" is invalid'),
            (lambda: client.copy("tiny-target", "mine:" + "t" * 81), "is invalid"),
            (lambda: client.show(" tiny-target:latest "), "has no spaces around it"),
            (lambda: client.show("m" * 81), "the model is longer than 80 characters"),
        ]
        for call, words in refusals:
            with pytest.raises(ollama.ResponseError) as refused:
                call()
            assert refused.value.status_code == 400 and words in refused.value.error, refused.value.error
        assert not [name for name in names(url) if name.startswith(("mine", "m" * 80))]
        assert client.show("tiny-target").details.family  # the name as it is still answers
        client.copy("tiny-target", "m" * 80)  # Ollama's longest model part
        assert f"{'m' * 80}:latest" in names(url)
