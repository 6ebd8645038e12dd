"""Per-blob locks a pull holds while it downloads or commits a blob; a delete skips a held blob.

They live in the system temp dir, one folder per store, out of the store itself, and are never
deleted: removing a lock file another process holds would let a third one lock a fresh file of the
same name.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from pathlib import Path

from filelock import FileLock, Timeout


def lock_dir(store: Path) -> Path:
    """The lock folder of the store at `store`, made (open to every user) where it is missing."""
    key = hashlib.sha256(str(store.resolve()).encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / "ollama-spec-locks" / key
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True)
        with suppress(PermissionError):
            os.chmod(path, 0o1777)  # other users pulling into the same shared store
            os.chmod(path.parent, 0o1777)
    return path


def lock_path(store: Path, hex_digest: str) -> Path:
    """The lock file a pull holds while it downloads or commits the blob `sha256-<hex_digest>`."""
    return lock_dir(store) / f"sha256-{hex_digest}.lock"


@contextmanager
def blob_lock(store: Path, hex_digest: str, waiting=lambda: None, stop=lambda: False, poll: float = 0.2):
    """Hold the blob's lock while downloading it.

    If another pull holds it, `waiting()` is called once and `stop()` between tries: it raises
    to give up, so that Ctrl-C does not wait for the other pull to finish.
    """
    lock = FileLock(str(lock_path(store, hex_digest)), mode=0o666)
    told = False
    while True:
        try:
            lock.acquire(timeout=poll)
            break
        except Timeout:
            stop()
            if not told:
                waiting()
                told = True
    try:
        yield
    finally:
        lock.release()


@contextmanager
def holding(store: Path, hex_digests: Iterable[str]) -> Iterator[None]:
    """Hold every blob's lock at once, taken in digest order so that two holders never wait on each
    other. While they are held no delete removes any of these blobs (it skips a locked one)."""
    with ExitStack() as stack:
        for hex_digest in sorted(set(hex_digests)):
            stack.enter_context(blob_lock(store, hex_digest))
        yield
