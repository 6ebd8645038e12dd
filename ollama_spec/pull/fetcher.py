"""Download a model's blobs a few at a time; Ctrl-C or the first error stops them all cleanly. Then the
manifest, under the locks of every blob it names."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

from ollama_spec.models.names import ModelRef
from ollama_spec.pull.download import BlobProgress, Cancelled, fetch_blob
from ollama_spec.pull.progress import PullEvent
from ollama_spec.pull.settings import PullSettings
from ollama_spec.pull.writer import Blob, BlobsGone, StoreWriter

CANCEL_GRACE = 2.0  # seconds the downloads get to stop between chunks after Ctrl-C or an error
REFETCHES = 2  # times a pull fetches again the blobs a concurrent delete removed before its manifest


def fetch_and_write(
    client: httpx.Client,
    urls: Mapping[Blob, str],
    writer: StoreWriter,
    settings: PullSettings,
    ref: ModelRef,
    report: Callable[[PullEvent], None],
    cancel: threading.Event,
    manifest: Callable[[Mapping[Blob, Path | None]], bytes],
) -> None:
    """Fetch every blob, then write the manifest that `manifest(downloads)` builds (it may add small layers).

    The blobs found present were checked without a lock; a delete of a model sharing one may remove it
    before the manifest is written, which `write_manifest` sees under the locks: those are fetched again."""
    for attempt in range(REFETCHES + 1):
        downloads = fetch_all(client, urls, writer, settings, ref, report, cancel)
        data = manifest(downloads)
        report(PullEvent(ref.display, "writing manifest"))
        try:
            writer.write_manifest(ref, data, downloads)
            return
        except BlobsGone as gone:
            if attempt == REFETCHES:
                raise BlobsGone(gone.blobs, "no manifest was written; run the same pull again") from None
            report(PullEvent(ref.display, f"{gone}: fetching again"))


def fetch_all(
    client: httpx.Client,
    urls: Mapping[Blob, str],
    writer: StoreWriter,
    settings: PullSettings,
    ref: ModelRef,
    report: Callable[[PullEvent], None],
    cancel: threading.Event,
) -> dict[Blob, Path | None]:
    """Fetch and verify every blob (at most `settings.concurrency` at once): each blob's verified download,
    None for those the store has already. `write_manifest` moves them into `blobs/`.

    On an error or Ctrl-C the other downloads stop at their next chunk, keeping their partial files for
    the next pull.
    """
    progress = _blob_progress(ref, report)
    queue = list(urls.items())
    results: dict[Blob, Path | None] = {}
    failures: list[BaseException] = []
    lock = threading.Lock()

    def work() -> None:
        while not cancel.is_set():
            with lock:
                if not queue or failures:
                    return
                blob, url = queue.pop(0)
            try:
                results[blob] = fetch_blob(client, url, blob, writer, progress, cancel)
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, which raises it
                with lock:
                    failures.append(exc)
                cancel.set()
                return

    # Daemon threads: a download stuck in a silent socket read must not hold up Ctrl-C (or the exit
    # after it) for the read timeout; what it received is on disk, and the next pull resumes it.
    workers = [
        threading.Thread(target=work, name=f"pull-{i}", daemon=True)
        for i in range(min(max(1, settings.concurrency), len(queue)))
    ]
    _run(workers, failures, cancel)
    if failures:
        raise next((f for f in failures if not isinstance(f, Cancelled)), failures[0])
    report(PullEvent(ref.display, "verifying sha256 digest"))
    return {blob: results[blob] for blob in urls}


def _blob_progress(ref: ModelRef, report: Callable[[PullEvent], None]) -> Callable[[BlobProgress], None]:
    """A blob's progress as the pull's events: "pulling <12 hex>" with its bytes, or its wait for another pull."""

    def progress(event: BlobProgress) -> None:
        short = event.blob.hex[:12]
        if event.status == "waiting for another pull":
            report(PullEvent(ref.display, f"waiting for another pull of {short}", event.blob.digest))
        else:
            report(PullEvent(ref.display, f"pulling {short}", event.blob.digest, event.blob.size, event.completed))

    return progress


def _run(workers: list[threading.Thread], failures: list[BaseException], cancel: threading.Event) -> None:
    """Start the downloads and wait for them to end, or for the first failure; on Ctrl-C, cancel them."""
    for worker in workers:
        worker.start()
    try:
        while any(worker.is_alive() for worker in workers) and not failures:
            for worker in workers:
                worker.join(timeout=0.2)  # short joins keep the main thread responsive to Ctrl-C
        _join(workers, CANCEL_GRACE)  # after a failure, the others stop at their next chunk
    except BaseException:
        cancel.set()
        _join(workers, CANCEL_GRACE)
        raise


def _join(workers: list[threading.Thread], seconds: float) -> None:
    """Give the downloads a moment to notice the cancel and close their files between chunks."""
    deadline = time.monotonic() + seconds
    for worker in workers:
        worker.join(timeout=max(0.0, deadline - time.monotonic()))
