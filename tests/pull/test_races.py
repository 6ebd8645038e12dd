"""Pulls, deletes and copies at the same time on one store: every manifest written names blobs that exist.

The pull here comes from a real registry on 127.0.0.1 into a store that already holds a model sharing its
blobs (the tiny pair under Ollama's default registry), so the pull finds them present and skips them, the
way the race was found: the delete of the other model runs between that check and the manifest.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from ollama_spec.errors import InvalidManifest
from ollama_spec.pull import PullSettings, pull_models
from ollama_spec.pull.edits import copy_model, delete_model
from tests.pull_servers import registry_alone
from tests.stores import inconsistencies

LIBRARY = Path("manifests/registry.ollama.ai/library")


@pytest.fixture
def registry(tiny_store, monkeypatch):
    with registry_alone(tiny_store, monkeypatch) as server:  # no daemon: the registry path
        yield server


def pull(registry, store: Path, model: str, report=lambda event: None) -> None:
    pull_models([f"{registry.host}/library/{model}:latest"], PullSettings(insecure=True), report, str(store))


def test_a_delete_after_the_pull_found_its_blobs_present_is_fetched_again(registry, store_copy):
    """The delete runs in the gap the race needs: the pull has found every blob present and not yet written
    its manifest. The pull notices the deleted blobs, fetches them again and its manifest is whole."""
    statuses = []

    def report(event) -> None:
        statuses.append(event.status)
        if event.status == "verifying sha256 digest" and statuses.count(event.status) == 1:
            delete_model("tiny-draft", str(store_copy))  # shares every blob with the model being pulled

    pull(registry, store_copy, "tiny-draft", report)
    assert not (store_copy / LIBRARY / "tiny-draft" / "latest").exists()
    assert statuses[-1] == "success"
    assert any("fetching again" in status for status in statuses)
    assert inconsistencies(store_copy) == []
    fetched = [path for _, path, _ in registry.requests if "/blobs/" in path]
    assert fetched  # the blobs the delete removed came from the registry


def test_deletes_and_pulls_of_models_sharing_blobs_in_threads_leave_the_store_whole(registry, store_copy):
    """The race as found: a delete fired while a pull of a model sharing its blobs runs, many times over."""
    pulled = store_copy / "manifests" / registry.host / "library" / "tiny-draft" / "latest"
    for _ in range(12):
        if not (store_copy / LIBRARY / "tiny-draft" / "latest").exists():
            copy_model(f"{registry.host}/library/tiny-draft:latest", "tiny-draft", str(store_copy))
        if pulled.exists():
            delete_model(f"{registry.host}/library/tiny-draft:latest", str(store_copy))
        errors: list[BaseException] = []

        def run(job, errors=errors) -> None:
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - the test reports it
                errors.append(exc)

        threads = [
            threading.Thread(target=run, args=(lambda: pull(registry, store_copy, "tiny-draft"),)),
            threading.Thread(target=run, args=(lambda: delete_model("tiny-draft", str(store_copy)),)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert not errors, errors
        assert pulled.exists()
        assert inconsistencies(store_copy) == []


def test_a_copy_of_a_model_whose_blob_is_missing_writes_nothing(store_copy):
    doc = json.loads((store_copy / LIBRARY / "tiny-draft" / "latest").read_text())
    model = doc["layers"][0]["digest"]
    (store_copy / "blobs" / model.replace(":", "-")).unlink()
    with pytest.raises(InvalidManifest, match=f"tiny-draft: its blob {model} is missing from the store"):
        copy_model("tiny-draft", "other:copy", str(store_copy))
    assert not (store_copy / LIBRARY / "other").exists()
    (store_copy / LIBRARY / "tiny-draft" / "latest").unlink()  # what the test broke on purpose, for the store check


def test_two_pulls_sharing_a_blob_while_one_model_is_deleted(registry, tmp_path):
    """Pull A has verified its downloads; pull B of a model sharing blobs with it takes A's finished partial
    files (the same files), moves them into blobs/ with its manifest, and B's model is deleted, blobs and all,
    before A writes its manifest. A finds its verified files gone: it fetches those blobs again, and the store
    is whole."""
    store = tmp_path / "store"
    statuses: list[str] = []

    def report(event) -> None:
        statuses.append(event.status)
        if event.status == "verifying sha256 digest" and statuses.count(event.status) == 1:
            pull(registry, store, "tiny-draft")  # shares the template, params and license blobs
            delete_model(f"{registry.host}/library/tiny-draft:latest", str(store))

    pull(registry, store, "tiny-target", report)
    assert statuses[-1] == "success"
    assert any("fetching again" in status for status in statuses)
    assert (store / "manifests" / registry.host / "library" / "tiny-target" / "latest").is_file()
    assert not (store / "manifests" / registry.host / "library" / "tiny-draft").exists()
    assert inconsistencies(store) == []
