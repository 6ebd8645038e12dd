"""One blob's download: the lock another pull holds, and giving up on Ctrl-C while waiting for it."""

from __future__ import annotations

import hashlib
import threading

import httpx
import pytest
from filelock import FileLock

from ollama_spec.models.store import StoreRoot
from ollama_spec.pull.download import Cancelled, fetch_blob
from ollama_spec.pull.locks import lock_dir
from ollama_spec.pull.writer import Blob, StoreWriter
from tests.pull_servers import BlobStorage


def test_waiting_for_another_pull_can_be_interrupted(tmp_path):
    writer = StoreWriter(StoreRoot(tmp_path, "test"))
    writer.prepare()
    data = b"x" * 100
    blob = Blob(f"sha256:{hashlib.sha256(data).hexdigest()}", len(data))
    other = FileLock(str(lock_dir(writer.path) / f"sha256-{blob.hex}.lock"))
    other.acquire()  # another pull is downloading this blob
    cancel, seen, errors = threading.Event(), [], []

    def run():
        try:
            with httpx.Client() as client:
                fetch_blob(client, "http://127.0.0.1:9/never", blob, writer, seen.append, cancel)
        except Cancelled as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=1)
    assert thread.is_alive() and [event.status for event in seen] == ["waiting for another pull"]
    cancel.set()
    thread.join(timeout=5)
    other.release()
    assert not thread.is_alive() and len(errors) == 1
    assert not writer.has_blob(blob) and not writer.partial_path(blob).exists()


def test_a_finished_partial_left_by_another_pull_is_used_without_a_request(tmp_path):
    writer = StoreWriter(StoreRoot(tmp_path, "test"))
    writer.prepare()
    data = b"y" * 100
    blob = Blob(f"sha256:{hashlib.sha256(data).hexdigest()}", len(data))
    writer.partial_path(blob).write_bytes(data)
    with httpx.Client() as client:  # nothing listens on port 9: any request would fail
        path = fetch_blob(client, "http://127.0.0.1:9/never", blob, writer, lambda e: None, threading.Event())
    assert path == writer.partial_path(blob)
    writer.commit_blob(blob, path)
    assert writer.blob_path(blob).read_bytes() == data and not path.exists()


@pytest.mark.parametrize(("size", "ranges"), [(99, ["bytes=99-"]), (101, [None])])
def test_partial_resumes_or_restarts_when_longer_than_the_blob(tmp_path, size, ranges):
    writer = StoreWriter(StoreRoot(tmp_path, "test"))
    writer.prepare()
    data = b"z" * 100
    blob = Blob(f"sha256:{hashlib.sha256(data).hexdigest()}", len(data))
    writer.partial_path(blob).write_bytes(b"z" * size)
    storage = BlobStorage({blob.digest: data})
    try:
        with httpx.Client() as client:
            path = fetch_blob(client, f"{storage.url}/{blob.digest}", blob, writer, lambda e: None, threading.Event())
    finally:
        storage.close()
    assert path.read_bytes() == data and storage.blob_gets(blob.digest) == ranges
