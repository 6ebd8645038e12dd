"""Deletes while clients list and show: a model deleted mid-answer is left out of a listing, and is a 404 to
/api/show, never a 500. Through Ollama's and OpenAI's own clients, on a real serve over a copy of the store.

Where a delete lands between two reads of the store decides what breaks; those moments are a few
microseconds wide, so the first tests put a delete exactly there (at the store's own reads), and the last
runs the shape the fault round ran, bounded: copies deleted 8 at a time while clients list."""

from __future__ import annotations

import shutil
import threading
from collections import Counter

import ollama
import pytest
from openai import OpenAI

from ollama_spec.models import store as stores
from ollama_spec.pull.edits import copy_model, delete_model
from tests.serving import running_store
from tests.stores import LIBRARY


def listed(url: str) -> tuple[set[str], set[str]]:
    """The names /api/tags (Ollama's client) and /v1/models (OpenAI's) give."""
    tags = {m.model for m in ollama.Client(host=url).list().models}
    ids = {m.id for m in OpenAI(base_url=url + "/v1", api_key="none").models.list()}
    return tags, ids


def test_a_model_whose_folder_goes_between_two_reads_of_the_listing_is_left_out(store_copy, monkeypatch):
    """The listing found the model's folder, then a delete removed it (with its last tag) before it was read."""
    copy_model("tiny-target", "gone-soon", str(store_copy))
    folder = store_copy.joinpath(*LIBRARY, "gone-soon")
    is_ = stores._is

    def deleted_after_the_check(path, test, parent):
        answer = is_(path, test, parent)
        if answer and path == folder:
            shutil.rmtree(folder)
        return answer

    with running_store(store_copy, no_draft=True) as (url, _):
        monkeypatch.setattr(stores, "_is", deleted_after_the_check)
        tags, ids = listed(url)
        assert "gone-soon:latest" not in tags and "tiny-target:latest" in tags
        assert tags == ids


def test_a_model_whose_manifest_goes_after_it_was_found_is_not_found(store_copy, monkeypatch):
    """A delete between finding a manifest and reading it: left out of the listing, a 404 to /api/show."""
    for name in ("gone-a", "gone-b"):
        copy_model("tiny-target", name, str(store_copy))
    load = stores.Store._load

    def deleted_when_read(self, ref, path):
        if ref.model.startswith("gone-"):
            path.unlink(missing_ok=True)
        return load(self, ref, path)

    with running_store(store_copy, no_draft=True) as (url, _):
        monkeypatch.setattr(stores.Store, "_load", deleted_when_read)
        with pytest.raises(ollama.ResponseError) as shown:
            ollama.Client(host=url).show("gone-b")
        assert shown.value.status_code == 404 and "not found" in shown.value.error
        tags, ids = listed(url)
        assert not [name for name in tags | ids if name.startswith("gone-")] and "tiny-target:latest" in tags


def test_a_model_whose_files_go_while_show_reads_them_is_not_found(store_copy, monkeypatch, tmp_path):
    """/api/show found the model, then its manifest and blobs went (a delete) while it read their headers."""
    copy_model("tiny-target", "gone-soon", str(store_copy))
    from ollama_spec.server.serving import pairs as pair_module

    resolve, away = pair_module.resolve_stored, []

    def deleted_while_read(stored):
        if stored.name.startswith("gone-soon"):
            delete_model("gone-soon", str(store_copy))
            # its weights go too (a copy shares them with tiny-target, put back afterwards)
            weights = stores.blob_path(stored.root, stored.layer("model").digest)
            away.append((shutil.move(weights, tmp_path / "weights"), weights))
        return resolve(stored)

    with running_store(store_copy, no_draft=True) as (url, _):
        monkeypatch.setattr(pair_module, "resolve_stored", deleted_while_read)
        with pytest.raises(ollama.ResponseError) as shown:
            ollama.Client(host=url).show("gone-soon")
        assert shown.value.status_code == 404 and "not found" in shown.value.error
    for moved, weights in away:
        shutil.move(moved, weights)


def test_copies_deleted_8_at_a_time_while_clients_list(store_copy):
    """The fault round's shape, bounded: 24 copies deleted by 8 clients while 4 others list and show, through
    both client libraries. Every answer is a listing or a 404, each listing a subset of what was there."""
    names = [f"race{i}:latest" for i in range(24)]
    for name in names:
        copy_model("tiny-target", name, str(store_copy))
    answers: Counter[str] = Counter()
    failures: list[str] = []
    done = threading.Event()

    def lister(url: str, k: int) -> None:
        client = ollama.Client(host=url, timeout=60)
        openai_client = OpenAI(base_url=url + "/v1", api_key="none", timeout=60, max_retries=0)
        while not done.is_set():
            try:
                tags = {m.model for m in client.list().models}
                ids = {m.id for m in openai_client.models.list()}
                assert "tiny-target:latest" in tags and "tiny-target:latest" in ids
                assert (tags | ids) <= {*names, "tiny-target:latest"} | set(tags_before)
                answers["listed"] += 1
                client.show(names[(k * 7 + answers["listed"]) % len(names)])
                answers["shown"] += 1
            except ollama.ResponseError as exc:
                if exc.status_code == 404:
                    answers["404"] += 1
                else:
                    failures.append(f"{exc.status_code}: {exc.error}")
            except Exception as exc:  # noqa: BLE001 - every other failure is the test's finding
                failures.append(repr(exc))

    def deleter(url: str, mine: list[str]) -> None:
        client = ollama.Client(host=url, timeout=60)
        for name in mine:
            try:
                client.delete(name)
            except Exception as exc:  # noqa: BLE001
                failures.append(f"delete {name}: {exc!r}")

    with running_store(store_copy, no_draft=True) as (url, _):
        tags_before = {m.model for m in ollama.Client(host=url).list().models} - set(names)
        listers = [threading.Thread(target=lister, args=(url, k)) for k in range(4)]
        deleters = [threading.Thread(target=deleter, args=(url, names[j::8])) for j in range(8)]
        for thread in listers + deleters:
            thread.start()
        for thread in deleters:
            thread.join(120)
        done.set()
        for thread in listers:
            thread.join(120)
        assert not failures, failures[:5]
        assert answers["listed"] > 0
        tags, ids = listed(url)
        assert not tags & set(names) and tags == ids
