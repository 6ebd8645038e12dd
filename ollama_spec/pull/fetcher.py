"""Download a model's blobs a few at a time; Ctrl-C or the first error stops them all cleanly."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

import httpx

from ..names import ModelRef
from .download import BlobProgress, fetch_blob
from .progress import PullEvent
from .settings import PullSettings
from .writer import Blob, StoreWriter


def fetch_all(
    client: httpx.Client,
    urls: Mapping[Blob, str],
    writer: StoreWriter,
    settings: PullSettings,
    ref: ModelRef,
    report: Callable[[PullEvent], None],
    cancel: threading.Event,
) -> None:
    """Fetch and verify every blob (at most `settings.concurrency` at once), then move them all into `blobs/`.

    Nothing enters `blobs/` until every blob of the model is verified. On an error or Ctrl-C the
    other downloads stop at their next chunk, keeping their partial files for the next pull.
    """

    def progress(event: BlobProgress) -> None:
        short = event.blob.hex[:12]
        if event.status == "waiting for another pull":
            report(PullEvent(ref.display, f"waiting for another pull of {short}", event.blob.digest))
        else:
            report(PullEvent(ref.display, f"pulling {short}", event.blob.digest, event.blob.size, event.completed))

    pool = ThreadPoolExecutor(max_workers=max(1, settings.concurrency), thread_name_prefix="pull")
    futures = [pool.submit(fetch_blob, client, url, blob, writer, progress, cancel) for blob, url in urls.items()]
    try:
        pending = set(futures)
        while pending:
            # A timeout keeps the main thread responsive to Ctrl-C.
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_EXCEPTION)
            failed = next((f for f in done if f.exception() is not None), None)
            if failed is not None:
                cancel.set()
                wait(futures)
                raise failed.exception()
    except BaseException:
        cancel.set()
        wait(futures)
        raise
    finally:
        pool.shutdown(wait=True)
    report(PullEvent(ref.display, "verifying sha256 digest"))
    for blob, future in zip(urls, futures):
        if future.result() is not None:
            writer.commit_blob(blob, future.result())
