"""Deleting and copying models in the store, as Ollama's DeleteHandler and CopyModel do them.

Delete removes the manifest first (and the folders it leaves empty), then the blobs its layers and
config named that no other manifest names. Every file under `manifests/` counts as naming the digests
it holds, read leniently (a manifest this code could not load still keeps its blobs); when one cannot
be read at all, no blob is removed. Files in `blobs/` that are not a manifest's digest are never
touched. Copy writes the destination manifest as StoreWriter writes a pulled one: staged outside
`blobs/`, renamed into place. Both take the store root as `pull` does (--models-dir, OLLAMA_MODELS,
...), but never create a store.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock, Timeout

from ollama_spec.errors import InvalidManifest, ModelNotFound, StoreNotWritable
from ollama_spec.models.manifest import TooLarge, read_small
from ollama_spec.models.names import ModelRef, parse_model_name
from ollama_spec.models.store import blob_path, find_store_root
from ollama_spec.pull.locks import lock_path
from ollama_spec.pull.writer import BlobsGone, StoreWriter, named_blobs

log = logging.getLogger("ollama_spec.pull")


@dataclass(frozen=True)
class Deleted:
    """What `delete_model` removed: the model (as stored), its manifest, and the blobs no one else named."""

    name: str
    manifest: Path
    removed: tuple[str, ...]  # digests whose blob was deleted
    kept: tuple[str, ...]  # digests still named by another manifest (or in use by a pull)


def deletable_name(name: str, models_dir: str | None = None) -> str:
    """The model's name as the store spells it (`Llama3` finds `llama3:latest`; ModelNotFound if none),
    checked deletable first: StoreNotWritable when its manifest's folder or `blobs/` is
    not writable by this user (a read-only mount, another owner), before anything is unloaded for it."""
    writer = _writer(models_dir)
    path, ref = _existing(writer, parse_model_name(name), name)
    for folder in (path.parent, writer.path / "blobs"):
        if not os.access(folder, os.W_OK):
            raise StoreNotWritable(
                f"cannot delete {ref.display}: {folder} is not writable by you (a read-only store, or another "
                "user's); delete it as the store's owner, or through the Ollama daemon (ollama rm)"
            )
    return ref.display


def delete_model(name: str, models_dir: str | None = None) -> Deleted:
    """Remove `name`'s manifest, then every blob it named that no remaining manifest names.

    The blobs are looked up in the other manifests while their locks are held (those a pull holds are
    kept): a pull writes its manifest under the same locks, so it is either seen here or finds the blob
    gone and fetches it again, never a manifest naming a deleted blob."""
    writer = _writer(models_dir)
    path, ref = _existing(writer, parse_model_name(name), name)
    digests = _named_digests(path) or set()  # an unreadable manifest is removed all the same
    with writer.writing(then="delete it again"):
        try:
            path.unlink()
        except FileNotFoundError:  # another delete took it first
            raise ModelNotFound(f"model '{name}' not found in {writer.path} (from {writer.root.source})") from None
        _prune_empty(path.parent, writer.path / "manifests")
    with _unheld(writer, digests) as free:
        still_named = _digests_in_use(writer.path / "manifests")
        if still_named is None:
            log.warning("kept every blob of %s: a manifest in %s could not be read", ref.display, writer.path)
            return Deleted(ref.display, path, (), tuple(sorted(digests)))
        removed = sorted(free - still_named)
        with writer.writing(then="delete it again"):
            for digest in removed:
                blob_path(writer.path, f"sha256:{digest}").unlink(missing_ok=True)
    return Deleted(ref.display, path, tuple(removed), tuple(sorted(digests - set(removed))))


def copy_model(source: str, destination: str, models_dir: str | None = None) -> str:
    """Write `destination`'s manifest as a copy of `source`'s (the same blobs); return its stored name.

    An existing destination is replaced, as Ollama replaces it; a name that differs only in case
    replaces the stored spelling."""
    writer = _writer(models_dir)
    source_path, _ = _existing(writer, parse_model_name(source), source)
    target = parse_model_name(destination)
    target_path = writer.manifest_path(target)
    stored = ModelRef(*target_path.relative_to(writer.path / "manifests").parts)
    if target_path == source_path:
        return stored.display
    try:
        data = read_small(source_path)
    except TooLarge:
        raise InvalidManifest(f"{source}: its manifest {source_path} is too large to be a manifest") from None
    except OSError as exc:
        raise InvalidManifest(f"{source}: its manifest {source_path} cannot be read ({exc.strerror or exc})") from None
    writer.prepare(target)
    try:
        writer.write_manifest(target, data, then="copy it again")
    except BlobsGone as gone:  # the source's own blobs are missing (or were deleted meanwhile)
        raise InvalidManifest(f"{source}: {_missing(gone)}; nothing was copied") from None
    return stored.display


def _missing(gone: BlobsGone) -> str:
    return "its blob " + ", ".join(blob.digest for blob in gone.blobs[:3]) + " is missing from the store"


def _writer(models_dir: str | None) -> StoreWriter:
    return StoreWriter(find_store_root(models_dir))


def _existing(writer: StoreWriter, ref: ModelRef, name: str) -> tuple[Path, ModelRef]:
    """The manifest file of `ref` matched case-insensitively, and the name as stored."""
    path = writer.manifest_path(ref)
    if not path.is_file():
        raise ModelNotFound(f"model '{name}' not found in {writer.path} (from {writer.root.source})")
    return path, ModelRef(*path.relative_to(writer.path / "manifests").parts)


def _named_digests(path: Path) -> set[str] | None:
    """The well-formed digests (hex) a manifest's layers and config name; None when it cannot be read.

    A file that is not JSON names nothing (as Ollama, which skips corrupt manifests); nor does one deleted
    since it was found."""
    try:
        data = read_small(path)
    except (TooLarge, FileNotFoundError):
        return set()
    except OSError:
        return None
    return {blob.hex for blob in named_blobs(data)}


def _digests_in_use(manifests: Path) -> set[str] | None:
    """Every digest any file under `manifests/` names; None when a folder or a file cannot be read (one
    that another delete removed meanwhile names nothing)."""
    named: set[str] = set()
    try:
        for folder, _, files in os.walk(manifests, onerror=_raise):
            for file in files:
                digests = _named_digests(Path(folder) / file)
                if digests is None:
                    return None
                named |= digests
    except OSError:
        return None
    return named


def _raise(exc: OSError) -> None:
    if not isinstance(exc, FileNotFoundError):
        raise exc


@contextmanager
def _unheld(writer: StoreWriter, hex_digests: set[str]) -> Iterator[set[str]]:
    """The locks of the blobs no pull holds right now, taken without waiting: the digests it got."""
    with ExitStack() as stack:
        free = set()
        for digest in sorted(hex_digests):
            lock = FileLock(str(lock_path(writer.path, digest)), mode=0o666)
            try:
                lock.acquire(timeout=0)
            except Timeout:
                continue
            stack.callback(lock.release)
            free.add(digest)
        yield free


def _prune_empty(folder: Path, manifests: Path) -> None:
    """Remove `folder` and the folders above it that are left empty, up to (not including) `manifests/`."""
    while folder != manifests and manifests in folder.parents:
        try:
            folder.rmdir()
        except OSError:  # not empty (another tag), or gone
            return
        folder = folder.parent
