"""Deleting and copying models in a real store: the tiny synthetic pair, whose models share blobs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from filelock import FileLock

from ollama_spec.errors import InvalidModelName, ModelNotFound
from ollama_spec.models.store import Store, StoreRoot
from ollama_spec.pull import edits
from ollama_spec.pull.edits import copy_model, deletable_name, delete_model
from ollama_spec.pull.locks import lock_path
from ollama_spec.pull.writer import PARTIAL_DIR, StoreWriter
from tests.pull_servers import snapshot

LIBRARY = Path("manifests/registry.ollama.ai/library")


@pytest.fixture
def store(tiny_store, tmp_path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(tiny_store, root)
    return root


def digests(store: Path, model: str, tag: str = "latest") -> set[str]:
    doc = json.loads((store / LIBRARY / model / tag).read_text())
    return {layer["digest"] for layer in [*doc["layers"], doc["config"]]}


def blob_file(store: Path, digest: str) -> Path:
    return store / "blobs" / digest.replace(":", "-")


def everyone_else(store: Path, *gone: tuple[str, str]) -> set[str]:
    named = set()
    for path in (store / "manifests").rglob("*"):
        if path.is_file() and (path.parent.name, path.name) not in gone:
            named |= digests(store, path.parent.name, path.name)
    return named


def test_delete_removes_manifest_then_only_blobs_nobody_else_names(store):
    mine = digests(store, "tiny-draft")
    deleted = delete_model("tiny-draft", str(store))
    others = everyone_else(store)
    assert deleted.name == "tiny-draft:latest"
    assert not (store / LIBRARY / "tiny-draft" / "latest").exists()
    assert set(deleted.removed) == {d.removeprefix("sha256:") for d in mine - others}
    assert deleted.removed and deleted.kept  # the template, params and license are shared with the target
    for digest in mine - others:
        assert not blob_file(store, digest).exists()
    for digest in others:
        assert blob_file(store, digest).exists()
    target = Store(StoreRoot(store, "test")).resolve("tiny-target")
    target.model_info()  # still whole
    assert target.text_layer("template")


def test_last_tag_removes_its_folders_and_every_blob_it_alone_named(store):
    for tag in ("q4_0", "q8_0"):
        delete_model(f"tiny-draft:{tag}", str(store))
    assert (store / LIBRARY / "tiny-draft").is_dir()  # latest is still there
    delete_model("tiny-draft", str(store))
    assert not (store / LIBRARY / "tiny-draft").exists()
    assert (store / "manifests" / "registry.ollama.ai").is_dir()


def test_delete_matches_names_as_ollama_does(store):
    assert deletable_name("TINY-Draft:Q4_0", str(store)) == "tiny-draft:q4_0"
    assert delete_model("TINY-Draft:Q4_0", str(store)).name == "tiny-draft:q4_0"
    assert not (store / LIBRARY / "tiny-draft" / "q4_0").exists()


def test_unknown_and_invalid_names(store):
    before = snapshot(store)
    with pytest.raises(ModelNotFound, match="model 'nope' not found"):
        delete_model("nope", str(store))
    with pytest.raises(ModelNotFound):
        copy_model("nope", "other", str(store))
    with pytest.raises(InvalidModelName):
        delete_model("../../etc", str(store))
    with pytest.raises(InvalidModelName):
        copy_model("tiny-draft", "bad name", str(store))
    assert snapshot(store) == before


def test_files_that_are_no_blob_are_left_alone(store):
    odd = ["sha256-abc", "notes.txt", "sha256-" + "A" * 64]
    for name in odd:
        (store / "blobs" / name).write_text("x")
    unnamed = blob_file(store, "sha256:" + "1" * 64)
    unnamed.write_text("no manifest names me")
    for tag in ("latest", "q4_0", "q8_0"):
        delete_model(f"tiny-draft:{tag}", str(store))
    assert all((store / "blobs" / name).exists() for name in odd)
    assert unnamed.exists()  # deletes touch the deleted model's blobs only; pruning is Ollama's


def test_a_broken_manifest_is_deleted_and_keeps_its_blobs_to_ollama(store):
    before = {p.name for p in (store / "blobs").iterdir()}
    (store / LIBRARY / "tiny-draft" / "latest").write_text("{not json")
    assert delete_model("tiny-draft", str(store)).removed == ()
    assert {p.name for p in (store / "blobs").iterdir()} == before


def test_a_broken_manifest_elsewhere_keeps_nothing_it_might_name(store):
    # another manifest names the draft's model blob only as a string in a loose document
    model_blob = next(d for d in digests(store, "tiny-draft") if blob_file(store, d).stat().st_size > 100_000)
    extra = store / LIBRARY / "other" / "latest"
    extra.parent.mkdir()
    extra.write_text(json.dumps({"layers": [{"digest": model_blob}, "junk", {"digest": 7}]}))
    delete_model("tiny-draft", str(store))
    assert blob_file(store, model_blob).exists()


def test_an_unreadable_manifest_keeps_every_blob(store, monkeypatch):
    real = edits.read_small
    other = store / LIBRARY / "tiny-target" / "latest"

    def read_small(path, *args, **kwargs):
        if Path(path) == other:
            raise PermissionError(13, "Permission denied")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(edits, "read_small", read_small)
    before = {p.name for p in (store / "blobs").iterdir()}
    deleted = delete_model("tiny-draft", str(store))
    assert deleted.removed == () and not (store / LIBRARY / "tiny-draft" / "latest").exists()
    assert {p.name for p in (store / "blobs").iterdir()} == before


def test_a_blob_a_pull_holds_is_kept(store):
    mine = digests(store, "tiny-draft") - everyone_else(store, ("tiny-draft", "latest"))
    held = min(mine)
    writer = StoreWriter(StoreRoot(store, "test"))
    with FileLock(str(lock_path(writer.path, held.removeprefix("sha256:")))):
        deleted = delete_model("tiny-draft", str(store))
    assert held.removeprefix("sha256:") in deleted.kept
    assert blob_file(store, held).exists()


def test_copy_writes_a_manifest_naming_the_same_blobs(store):
    blobs = snapshot(store / "blobs")
    assert copy_model("tiny-draft", "me/my-draft:v1", str(store)) == "me/my-draft:v1"
    copied = store / "manifests/registry.ollama.ai/me/my-draft/v1"
    assert copied.read_bytes() == (store / LIBRARY / "tiny-draft" / "latest").read_bytes()
    assert snapshot(store / "blobs") == blobs
    assert list((store / PARTIAL_DIR).iterdir()) == []
    Store(StoreRoot(store, "test")).resolve("me/my-draft:v1").model_info()
    delete_model("me/my-draft:v1", str(store))  # the copy goes, the original keeps every blob
    Store(StoreRoot(store, "test")).resolve("tiny-draft").model_info()
    assert snapshot(store / "blobs") == blobs


def test_copy_over_an_existing_name_keeps_its_spelling(store):
    assert copy_model("tiny-target", "TINY-DRAFT:Q4_0", str(store)) == "tiny-draft:q4_0"
    assert (store / LIBRARY / "tiny-draft" / "q4_0").read_bytes() == (
        store / LIBRARY / "tiny-target/latest"
    ).read_bytes()
    assert not (store / LIBRARY / "TINY-DRAFT").exists()


def test_copy_onto_itself_changes_nothing(store):
    before = snapshot(store)
    assert copy_model("tiny-draft", "Tiny-Draft:latest", str(store)) == "tiny-draft:latest"
    assert snapshot(store) == before


def test_a_copy_on_a_full_disk_says_to_copy_again_not_to_pull(store, monkeypatch):
    import errno
    import os as real_os

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(real_os, "replace", full)
    from ollama_spec.errors import InsufficientDisk

    with pytest.raises(InsufficientDisk) as refused:
        copy_model("tiny-draft", "other:copy", str(store))
    assert "copy it again" in str(refused.value) and "pull" not in str(refused.value)
    assert not (store / LIBRARY / "other" / "copy").exists()


def test_staged_manifests_a_killed_writer_left_are_cleaned_at_the_next_write(store):
    import os as real_os
    import time

    partial = store / PARTIAL_DIR
    partial.mkdir(exist_ok=True)
    old, fresh, download = partial / "manifest-abc123", partial / "layer-def456", partial / "sha256-00.partial"
    for path in (old, fresh, download):
        path.write_bytes(b"{}")
    long_ago = time.time() - 3600
    for path in (old, download):
        real_os.utime(path, (long_ago, long_ago))
    copy_model("tiny-draft", "other:copy", str(store))
    assert not old.exists()  # staged an hour ago: its writer is gone
    assert fresh.exists()  # may be another writer's, being written now
    assert download.exists()  # a partial download is kept: the next pull resumes it


def test_deletes_at_once_remove_the_blobs_each_alone_named(store, monkeypatch):
    """Other deletes remove manifests and their folders while this delete looks for the blobs still named:
    what they removed names nothing, so the blob the deleted model alone named goes, not kept for ever."""
    own = {d for d in digests(store, "tiny-draft") if d not in everyone_else(store, ("tiny-draft", "latest"))}
    deleted_one = store / LIBRARY / "tiny-draft" / "latest"
    read = edits._named_digests
    walked: list[Path] = []

    def others_deleted_meanwhile(path: Path):
        if path != deleted_one:
            walked.append(path)
            if len(walked) == 1:  # the walk is under way: every other model's folder goes, unwalked ones too
                for folder in (store / LIBRARY).iterdir():
                    if folder != path.parent:
                        shutil.rmtree(folder)
            elif len(walked) == 2:
                path.unlink()  # and a manifest between being listed and being read
        return read(path)

    monkeypatch.setattr(edits, "_named_digests", others_deleted_meanwhile)
    deleted = delete_model("tiny-draft", str(store))
    assert walked and own and set(deleted.removed) >= {d.removeprefix("sha256:") for d in own}
    assert not any(blob_file(store, d).exists() for d in own)
