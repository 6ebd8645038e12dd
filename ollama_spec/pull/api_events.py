"""A pull as Ollama's `/api/pull` streams it: `pull_models` on a thread, its events as progress objects.

The objects are Ollama's api.ProgressResponse (`status`, and for a blob `digest`, `total`,
`completed`, each left out when empty): "pulling manifest", "pulling <12 hex>", "verifying sha256
digest", "writing manifest", then exactly one "success", last, after the manifest is written. Byte
counts are thinned to one per blob every PROGRESS_INTERVAL seconds (Ollama ticks every 60 ms). A
failure ends the stream with its PullError (or other OllamaSpecError), one line; when the consumer
stops listening, the pull stops at its next progress event.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import AsyncIterator
from dataclasses import replace

from ollama_spec.errors import OllamaSpecError, PullError, one_line
from ollama_spec.pull import PullSettings, pull_models
from ollama_spec.pull.progress import PullEvent, Thinning

PROGRESS_INTERVAL = 0.1  # seconds between two byte counts of one blob
log = logging.getLogger("ollama_spec.pull")


class _Stopped(Exception):
    """Raised inside the pull once nobody listens any more."""


def progress_object(event: PullEvent) -> dict:
    """One PullEvent as Ollama's ProgressResponse (Go's omitempty: no empty digest, no zero counts)."""
    row: dict = {"status": event.status}
    if event.digest:
        row["digest"] = event.digest
    if event.total:
        row["total"] = event.total
    if event.completed:
        row["completed"] = event.completed
    return row


async def pull_events(
    name: str,
    *,
    insecure: bool = False,
    models_dir: str | None = None,
    settings: PullSettings | None = None,
    interval: float = PROGRESS_INTERVAL,
) -> AsyncIterator[dict]:
    """Pull `name` (the daemon, the registry or Hugging Face, as `ollama-spec pull` chooses) and yield
    Ollama's progress objects; raises the pull's OllamaSpecError (a one-line message) if it fails."""
    settings = settings or PullSettings()
    if insecure:
        settings = replace(settings, insecure=True)
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue = asyncio.Queue()
    stopped = threading.Event()
    thinning, lock = Thinning(interval), threading.Lock()
    last: dict[str | None, dict] = {}  # each blob's last object: the same one twice is said once
    finished = object()

    def put(item: object) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the loop is gone: nobody listens
            stopped.set()

    def report(event: PullEvent) -> None:
        if stopped.is_set():
            raise _Stopped()
        if event.status == "success":
            return  # said once, below, after pull_models returns
        row = progress_object(event)
        with lock:  # the blobs' downloads report from threads of their own
            if row == last.get(event.digest) or not thinning.keep(event):
                return
            last[event.digest] = row
        put(row)

    def run() -> None:
        try:
            pull_models([name], settings, report, models_dir)
            put(finished)
        except _Stopped:
            log.info("the pull of %s stopped: its client went away", name)
        except OllamaSpecError as exc:
            put(exc)
        except Exception as exc:  # any failure ends the stream with one line, never a traceback
            if stopped.is_set():  # a download stopped by the listener going away
                return
            log.exception("the pull of %s failed", name)
            put(PullError(one_line(f"the pull of {name} failed: {type(exc).__name__}: {exc}")))

    thread = threading.Thread(target=run, name=f"api-pull {name}", daemon=True)
    thread.start()
    try:
        while True:
            item = await queue.get()
            if item is finished:
                yield {"status": "success"}
                return
            if isinstance(item, OllamaSpecError):
                raise item
            yield item
    finally:
        stopped.set()
