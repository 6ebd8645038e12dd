"""`pull_events`: a pull from a local registry as Ollama's /api/pull progress objects."""

from __future__ import annotations

import asyncio
import time

import pytest

from ollama_spec.errors import InvalidSetting, ModelNotFound
from ollama_spec.models.store import Store, StoreRoot
from ollama_spec.pull.api_events import progress_object, pull_events
from ollama_spec.pull.progress import PullEvent
from tests.pull_servers import registry_alone


@pytest.fixture
def registry(tiny_store, monkeypatch):
    with registry_alone(tiny_store, monkeypatch) as server:
        yield server


def collect(name: str, **kwargs) -> list[dict]:
    async def run():
        return [event async for event in pull_events(name, **kwargs)]

    return asyncio.run(run())


def test_events_are_ollamas_and_success_comes_once_last(registry, tmp_path):
    name = f"{registry.host}/library/tiny-draft:latest"
    events = collect(name, insecure=True, models_dir=str(tmp_path))
    statuses = [e["status"] for e in events]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    assert statuses.count("success") == 1
    blobs = [e for e in events if "digest" in e]
    assert blobs and all(e["status"] == f"pulling {e['digest'][7:19]}" and e["total"] > 0 for e in blobs)
    assert all(set(e) <= {"status", "digest", "total", "completed"} for e in events)
    for digest in {e["digest"] for e in blobs}:  # every blob ends complete
        last = [e for e in blobs if e["digest"] == digest][-1]
        assert last["completed"] == last["total"]
    Store(StoreRoot(tmp_path, "test")).resolve(name).model_info()


def test_byte_counts_are_thinned(registry, tmp_path):
    registry.behaviour.delay = 0.01  # 16 KiB each 10 ms: the 870 KB model blob takes half a second
    name = f"{registry.host}/library/tiny-target:latest"
    started = time.monotonic()
    events = collect(name, insecure=True, models_dir=str(tmp_path), interval=0.2)
    took = time.monotonic() - started
    biggest = max((e for e in events if "total" in e), key=lambda e: e["total"])
    counts = [e for e in events if e.get("digest") == biggest["digest"]]
    assert 2 <= len(counts) <= took / 0.2 + 2


def test_a_failure_is_one_line(registry, tmp_path):
    with pytest.raises(ModelNotFound, match="not found") as caught:
        collect(f"{registry.host}/library/missing:latest", insecure=True, models_dir=str(tmp_path))
    assert "\n" not in str(caught.value)
    with pytest.raises(InvalidSetting, match="plain HTTP"):
        collect(f"http://{registry.host}/library/tiny-draft", models_dir=str(tmp_path))


def test_a_listener_that_leaves_stops_the_pull(registry, tmp_path):
    registry.behaviour.delay = 0.05  # the model blob would take about three seconds
    name = f"{registry.host}/library/tiny-target:latest"

    async def leave_early():
        events = pull_events(name, insecure=True, models_dir=str(tmp_path))
        async for event in events:
            if event.get("completed"):
                break
        await events.aclose()

    asyncio.run(leave_early())
    assert registry.idle_within(1.0)  # the download was cut off, not left to finish (about three seconds)
    assert not (tmp_path / "manifests" / registry.host).exists()


def test_progress_object_leaves_out_empty_fields():
    assert progress_object(PullEvent("m", "pulling manifest")) == {"status": "pulling manifest"}
    assert progress_object(PullEvent("m", "pulling 0123456789ab", "sha256:0123456789ab", 10, 0)) == {
        "status": "pulling 0123456789ab",
        "digest": "sha256:0123456789ab",
        "total": 10,
    }
