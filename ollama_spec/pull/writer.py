"""The only code that writes to Ollama's store: verified blobs in, then the manifest, last.

Partial downloads, locks and staged manifests live in `<root>/.ollama-spec-partial/`, never in
`blobs/`: Ollama deletes files with odd names there when it starts. Every file reaches its final
name with one atomic rename on the same filesystem, so a reader (or Ollama) sees either nothing or
the whole, verified file.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from ollama_spec.config import ollama_var
from ollama_spec.errors import InsufficientDisk, PullError, StoreNotWritable
from ollama_spec.models.gguf_info import format_bytes
from ollama_spec.models.manifest import DIGEST
from ollama_spec.models.names import ModelRef
from ollama_spec.models.store import HOME_STORE, SERVICE_STORE, StoreRoot, blob_path, find_store_root
from ollama_spec.pull.locks import blob_lock, holding

PARTIAL_DIR = ".ollama-spec-partial"
# Headroom kept free beyond the blobs themselves (manifests, filesystem metadata, other writers).
DISK_MARGIN = 64 << 20
# A staged manifest or layer lives for milliseconds; one this old was left by a writer that was killed.
STALE_STAGED_SECONDS = 600
PULL_AGAIN = "run the same pull again (finished blobs and partial downloads are kept)"


@dataclass(frozen=True)
class Blob:
    """One blob a manifest needs: `sha256:<hex>` and its size in bytes."""

    digest: str
    size: int

    @property
    def hex(self) -> str:
        return self.digest.removeprefix("sha256:")


def writable_store_root(models_dir: str | None = None, environ: Mapping[str, str] | None = None) -> StoreRoot:
    """Where pulled models go: --models-dir, $OLLAMA_MODELS, an existing store, else ~/.ollama/models.

    Unlike the read path, a missing store is created (as `ollama pull` does).
    """
    environ = os.environ if environ is None else environ
    if models_dir:
        candidate = StoreRoot(Path(models_dir).expanduser(), "--models-dir")
    elif ollama_var("OLLAMA_MODELS", environ):
        candidate = StoreRoot(Path(ollama_var("OLLAMA_MODELS", environ)).expanduser(), "OLLAMA_MODELS")
    elif HOME_STORE.expanduser().exists() or not SERVICE_STORE.exists():
        candidate = StoreRoot(HOME_STORE.expanduser(), "~/.ollama/models")
    else:
        return find_store_root(environ={})
    if not candidate.path.exists():
        with _writing(candidate):
            candidate.path.mkdir(parents=True, exist_ok=True)
    checked = find_store_root(candidate.path)  # the read path's checks: a folder, not the one above the store
    return StoreRoot(checked.path, candidate.source)


@contextmanager
def _writing(root: StoreRoot, what: str = "the model store", then: str = PULL_AGAIN):
    """Turn permission and disk-full errors into the one-line errors the CLI prints; `then` is what to do
    once there is space again."""
    try:
        yield
    except PermissionError:
        raise StoreNotWritable(_not_writable(root, what)) from None
    except OSError as exc:
        if exc.errno == errno.EROFS:
            raise StoreNotWritable(_not_writable(root, what)) from None
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise InsufficientDisk(f"the disk holding {root.path} is full; free some space and {then}") from None
        raise


def _not_writable(root: StoreRoot, what: str) -> str:
    return (
        f"{what} {root.path} (from {root.source}) is not writable by you; pull through the Ollama daemon, "
        "or add yourself to group ollama with write access (sudo usermod -aG ollama $USER, then log in again), "
        "or pull into a store of your own: OLLAMA_MODELS=~/ollama-models ollama-spec pull ..."
    )


class StoreWriter:
    """Blobs and manifests into one store root, verified and atomic."""

    def __init__(self, root: StoreRoot):
        self.root = root

    @property
    def path(self) -> Path:
        return self.root.path

    @property
    def partial_dir(self) -> Path:
        return self.path / PARTIAL_DIR

    def writing(self, what: str = "the model store", then: str = PULL_AGAIN):
        return _writing(self.root, what, then)

    def prepare(self, ref: ModelRef | None = None) -> None:
        """Create blobs/, manifests/ and the partial folder; fail early, before any download, if any
        of them is not writable, nor the folder `ref`'s manifest goes into (the deepest one that
        exists: a manifest that cannot be written would leave blobs nobody names)."""
        with self.writing():
            self.partial_dir.mkdir(parents=True, exist_ok=True)
            folders = [self.path / "blobs", self.path / "manifests", self.partial_dir]
            for folder in folders:
                folder.mkdir(exist_ok=True)
            if ref is not None:
                folders.append(next(p for p in self.manifest_path(ref).parents if p.is_dir()))
            for folder in folders:
                probe_writable(folder)
            self._remove_stale_staged()

    def _remove_stale_staged(self) -> None:
        """Staged manifests and layers a killed writer left (partial downloads are kept: they resume)."""
        cutoff = time.time() - STALE_STAGED_SECONDS
        for pattern in ("manifest-*", "layer-*"):
            for staged in self.partial_dir.glob(pattern):
                with suppress(OSError):
                    if staged.stat().st_mtime < cutoff:
                        staged.unlink()

    def blob_path(self, blob: Blob) -> Path:
        return blob_path(self.path, blob.digest)

    def has_blob(self, blob: Blob) -> bool:
        """True when `blobs/sha256-<hex>` exists with the expected size.

        Blobs only ever reach that name after their sha256 was checked (by Ollama or by us), so
        the name is the digest; re-hashing 40 GB on every pull would cost minutes.
        """
        try:
            return self.blob_path(blob).stat().st_size == blob.size
        except FileNotFoundError:
            return False

    def partial_path(self, blob: Blob) -> Path:
        return self.partial_dir / f"sha256-{blob.hex}.partial"

    def partial_size(self, blob: Blob) -> int:
        try:
            return self.partial_path(blob).stat().st_size
        except FileNotFoundError:
            return 0

    def check_free_space(self, blobs: Iterable[Blob]) -> int:
        """Raise InsufficientDisk unless the missing blobs fit; return the bytes still to download."""
        needed = sum(max(0, b.size - self.partial_size(b)) for b in set(blobs) if not self.has_blob(b))
        free = free_bytes(self.path)
        if needed and needed + DISK_MARGIN > free:
            raise InsufficientDisk(
                f"not enough disk space in {self.path}: the download needs {format_bytes(needed)} "
                f"(plus {format_bytes(DISK_MARGIN)} to spare) and {format_bytes(free)} is free"
            )
        return needed

    def commit_blob(self, blob: Blob, verified_file: Path) -> Path:
        """Move a file whose sha256 was checked into `blobs/` under its final name (atomic).

        Under the blob's lock: another pull of a model sharing this blob may have moved it first.
        """
        with blob_lock(self.path, blob.hex):
            return self._move_in(blob, verified_file)

    def _move_in(self, blob: Blob, verified_file: Path) -> Path:
        """`commit_blob` for a caller that holds the blob's lock. Two pulls sharing a blob may hold the same
        verified file: the first moves it in, and when a delete has removed it from `blobs/` since, the
        second finds neither (BlobsGone: it is fetched again)."""
        target = self.blob_path(blob)
        with self.writing():
            if self.has_blob(blob):
                verified_file.unlink(missing_ok=True)
                return target
            try:
                os.chmod(verified_file, 0o644)
                os.replace(verified_file, target)
            except FileNotFoundError:
                raise BlobsGone([blob]) from None
        return target

    def add_bytes(self, data: bytes) -> Blob:
        """A small layer (template, params, config) into `blobs/`, staged and renamed like any blob."""
        blob = Blob(f"sha256:{hashlib.sha256(data).hexdigest()}", len(data))
        if not self.has_blob(blob):
            self.commit_blob(blob, self._staged(data, "layer-"))
        return blob

    def _staged(self, data: bytes, prefix: str, then: str = PULL_AGAIN) -> Path:
        with self.writing(then=then):
            fd, staged = tempfile.mkstemp(dir=self.partial_dir, prefix=prefix)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
            except BaseException:
                Path(staged).unlink(missing_ok=True)
                raise
        return Path(staged)

    def manifest_path(self, ref: ModelRef) -> Path:
        """Where `ref`'s manifest goes: over an existing one whose name differs only in case (as Ollama,
        whose names are case-insensitive, updates `llama3` when asked for `Llama3`), else as spelled."""
        path = self.path / "manifests"
        for part in ref.manifest_parts:
            exact = path / part
            if not exact.exists() and path.is_dir():
                exact = next((entry for entry in _entries(path) if entry.name.lower() == part.lower()), exact)
            path = exact
        return path

    def write_manifest(
        self, ref: ModelRef, data: bytes, downloads: Mapping[Blob, Path | None] | None = None, then: str = PULL_AGAIN
    ) -> Path:
        """Write the manifest last, atomically (staged in the partial folder, renamed into place), under the
        locks of every blob it names: the verified `downloads` are moved into `blobs/` and each named blob is
        checked present at that moment. A delete of another model sharing a blob has then either removed it
        before (BlobsGone: fetch it again) or keeps it, as it skips locked blobs and sees this manifest after."""
        path = self.manifest_path(ref)
        downloads = downloads or {}
        named = named_blobs(data)
        staged = self._staged(data, "manifest-", then)
        try:
            with holding(self.path, [blob.hex for blob in [*named, *downloads]]):
                for blob, verified in downloads.items():
                    if verified is not None:
                        self._move_in(blob, verified)
                gone = [blob for blob in named if not self._present(blob)]
                if gone:
                    raise BlobsGone(gone)
                with self.writing(then=then):
                    os.chmod(staged, 0o644)
                    _replace_into(staged, path)
        finally:
            staged.unlink(missing_ok=True)
        return path

    def _present(self, blob: Blob) -> bool:
        return self.has_blob(blob) if blob.size >= 0 else self.blob_path(blob).is_file()


def probe_writable(folder: Path) -> None:
    """Raise as a write into `folder` would (PermissionError, EROFS, ENOSPC) unless a file can be made there,
    leaving no name behind, even if the process is killed meanwhile: Ollama reads manifests/ and blobs/, and
    a stray file there stops its pruning. Linux makes the file without a name (O_TMPFILE); elsewhere, or
    on a filesystem without it, access(2) answers."""
    flag = getattr(os, "O_TMPFILE", 0)
    if flag:
        try:
            os.close(os.open(folder, flag | os.O_WRONLY, 0o600))
            return
        except FileNotFoundError:
            return  # a delete pruned the folder meanwhile: the manifest's write makes it again
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
    if not os.access(folder, os.W_OK | os.X_OK):
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(folder))


class BlobsGone(PullError):
    """Blobs a manifest names went missing before it was written (a delete of a model sharing them)."""

    def __init__(self, blobs: list[Blob], then: str = ""):
        self.blobs = blobs
        shown = ", ".join(blob.digest for blob in blobs[:3]) + (" ..." if len(blobs) > 3 else "")
        said = f"{shown} left the store before the manifest was written (a delete of a model sharing it)"
        super().__init__(f"{said}; {then}" if then else said)


def _entries(folder: Path) -> list[Path]:
    """`folder`'s entries in order; none when a delete removed it meanwhile."""
    try:
        return sorted(folder.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return []


def _replace_into(staged: Path, path: Path, tries: int = 5) -> None:
    """Rename `staged` to `path`, making its folders: a delete of the last model in one removes it when it finds
    it empty, which may fall between the two steps; the folder is then made again."""
    for attempt in range(tries):
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(staged, path)
            return
        except FileNotFoundError:
            if attempt == tries - 1 or not staged.exists():
                raise


def named_blobs(data: bytes) -> list[Blob]:
    """The blobs a manifest's layers and config name, read leniently (size -1 where it gives none)."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError):
        return []
    if not isinstance(doc, dict):
        return []
    layers = doc.get("layers") if isinstance(doc.get("layers"), list) else []
    found: dict[str, Blob] = {}
    for entry in [*layers, doc.get("config")]:
        if isinstance(entry, dict) and isinstance(entry.get("digest"), str) and DIGEST.fullmatch(entry["digest"]):
            size = entry.get("size")
            digest = "sha256:" + DIGEST.fullmatch(entry["digest"]).group(1)
            found[digest] = Blob(digest, size if isinstance(size, int) and not isinstance(size, bool) else -1)
    return list(found.values())


def free_bytes(path: Path) -> int:
    """Free bytes on the filesystem holding `path` (a seam for tests)."""
    return shutil.disk_usage(path).free
