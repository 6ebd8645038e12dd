"""StoreWriter's own rules: what it leaves in the folders Ollama reads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ollama_spec.models.names import parse_model_name
from ollama_spec.models.store import StoreRoot
from ollama_spec.pull import writer as writers
from ollama_spec.pull.writer import StoreWriter


def files_under(*folders: Path) -> list[str]:
    return sorted(str(path) for folder in folders for path in folder.rglob("*") if path.is_file())


def test_checking_the_store_is_writable_never_names_a_file_where_ollama_reads(tiny_store, tmp_path, monkeypatch):
    """A kill -9 can land at any moment of prepare(): at none of them may manifests/ or blobs/ hold a file
    ollama-spec made (a stray file in manifests/ stops Ollama's pruning). What the folders hold is taken
    at every file close, the moment between making a probe file and removing it."""
    root = tmp_path / "store"
    writer = StoreWriter(StoreRoot(root, "test"))
    writer.prepare()
    seen: list[list[str]] = []
    close = os.close

    def watched(fd: int) -> None:
        seen.append(files_under(root / "manifests", root / "blobs"))
        close(fd)

    monkeypatch.setattr(os, "close", watched)
    writer.prepare(parse_model_name("tiny-target"))
    (root / "manifests" / "registry.ollama.ai").mkdir()
    writer.prepare(parse_model_name("tiny-target"))  # probes the deepest folder that exists, too
    monkeypatch.undo()
    assert seen and all(files == [] for files in seen), seen
    assert files_under(root / "manifests", root / "blobs") == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_folder_that_is_not_writable_is_refused(tmp_path):
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        with pytest.raises(PermissionError):
            writers.probe_writable(folder)
    finally:
        folder.chmod(0o755)
    writers.probe_writable(folder)
    assert list(folder.iterdir()) == []
