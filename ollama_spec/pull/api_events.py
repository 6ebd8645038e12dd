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
    pull = _PullThread(name, asyncio.get_running_loop(), interval)
    thread = threading.Thread(target=pull.run, args=(settings, models_dir), name=f"api-pull {name}", daemon=True)
    thread.start()
    try:
        while True:
            item = await pull.queue.get()
            if item is _FINISHED:
                yield {"status": "success"}
                return
            if isinstance(item, OllamaSpecError):
                raise item
            yield item
    finally:
        pull.stopped.set()


_FINISHED = object()  # the pull's last item on the queue, once it succeeded


class _PullThread:
    """One pull on a thread of its own, handing its progress objects (then _FINISHED, or its error) to
    `queue` on the event loop; `stopped` once nobody listens."""

    def __init__(self, name: str, loop: asyncio.AbstractEventLoop, interval: float):
        self.name, self.loop = name, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.stopped = threading.Event()
        self.thinning, self.lock = Thinning(interval), threading.Lock()
        self.last: dict[str | None, dict] = {}  # each blob's last object: the same one twice is said once

    def put(self, item: object) -> None:
        try:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, item)
        except RuntimeError:  # the loop is gone: nobody listens
            self.stopped.set()

    def report(self, event: PullEvent) -> None:
        if self.stopped.is_set():
            raise _Stopped()
        if event.status == "success":
            return  # said once, by pull_events, after pull_models returns
        row = progress_object(event)
        with self.lock:  # the blobs' downloads report from threads of their own
            if row == self.last.get(event.digest) or not self.thinning.keep(event):
                return
            self.last[event.digest] = row
        self.put(row)

    def run(self, settings: PullSettings, models_dir: str | None) -> None:
        try:
            pull_models([self.name], settings, self.report, models_dir)
            self.put(_FINISHED)
        except _Stopped:
            log.info("the pull of %s stopped: its client went away", self.name)
        except OllamaSpecError as exc:
            self.put(exc)
        except Exception as exc:  # any failure ends the stream with one line, never a traceback
            if self.stopped.is_set():  # a download stopped by the listener going away
                return
            log.exception("the pull of %s failed", self.name)
            self.put(PullError(one_line(f"the pull of {self.name} failed: {type(exc).__name__}: {exc}")))
