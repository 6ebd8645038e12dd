"""Pull progress: one event type for all three paths, shown as bars, lines or JSON.

Events carry the fields of Ollama's own `/api/pull` stream (status, digest, total, completed),
so a daemon's progress passes through unchanged.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from dataclasses import asdict, dataclass
from typing import Protocol, TextIO

from tqdm import tqdm

from ollama_spec.models.gguf_info import format_bytes

_JSON_INTERVAL = 0.25  # seconds between two byte-count events of one blob in --json mode


@dataclass(frozen=True)
class PullEvent:
    model: str
    status: str
    digest: str | None = None
    total: int | None = None
    completed: int | None = None


class Reporter(Protocol):
    def __call__(self, event: PullEvent) -> None: ...


class QuietWhenGone:
    """A stream that goes quiet once its reader is gone (`pull ... | head -1`): the pull goes on and
    finishes, only its progress stops. A pull is a side effect; a closed pipe must not cut it short."""

    def __init__(self, stream: TextIO | None):
        self.stream = stream
        self.gone = stream is None  # started with the stream closed (`>&-`): Python has none

    def write(self, text: str) -> None:
        if self.gone:
            return
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed pipe, a full disk, a closed file: as Ollama, write on without it
            self.gone = True
            try:  # the interpreter flushes stdout once more at exit: let that land nowhere, silently
                os.dup2(os.open(os.devnull, os.O_WRONLY), self.stream.fileno())
            except (OSError, ValueError, AttributeError):
                pass

    def flush(self) -> None:
        pass  # every write flushes


class Thinning:
    """Byte counts of one blob at most every `interval` seconds; the last (completed == total) and every
    status without a byte count always pass. Not thread-safe on its own: callers hold their lock."""

    def __init__(self, interval: float = _JSON_INTERVAL):
        self.interval = interval
        self._last: dict[tuple[str, str], float] = {}

    def keep(self, event: PullEvent) -> bool:
        if not (event.digest and event.completed is not None and event.completed != event.total):
            return True
        key = (event.model, event.digest)
        now = time.monotonic()
        if now - self._last.get(key, -self.interval) < self.interval:
            return False
        self._last[key] = now
        return True


class JsonReporter:
    """One JSON object per line; byte counts thinned out, first and last always printed."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = QuietWhenGone(stream if stream is not None else sys.stdout)
        self._thinning = Thinning()
        self._lock = threading.Lock()

    def __call__(self, event: PullEvent) -> None:
        with self._lock:
            if not self._thinning.keep(event):
                return
            row = {k: v for k, v in asdict(event).items() if v is not None}
            self.stream.write(json.dumps(row) + "\n")


class LineReporter:
    """For pipes and logs: status changes as lines, no byte-by-byte progress."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = QuietWhenGone(stream if stream is not None else sys.stdout)
        self._seen: set[tuple[str, str, str | None]] = set()
        self._lock = threading.Lock()

    def __call__(self, event: PullEvent) -> None:
        key = (event.model, event.status, event.digest)
        with self._lock:
            if key in self._seen:
                return
            self._seen.add(key)
            size = f" ({format_bytes(event.total)})" if event.digest and event.total else ""
            self.stream.write(f"{event.model}: {event.status}{size}\n")


class BarReporter:
    """A terminal: one tqdm bar per layer (bytes, speed, ETA), status lines above them."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream or sys.stderr
        self._bars: dict[tuple[str, str], tqdm] = {}
        self._statuses: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def __call__(self, event: PullEvent) -> None:
        with self._lock:
            if event.digest and event.total:
                self._bar(event)
            elif (event.model, event.status) not in self._statuses:
                self._statuses.add((event.model, event.status))
                tqdm.write(f"{event.model}: {event.status}", file=self.stream)

    def _bar(self, event: PullEvent) -> None:
        key = (event.model, event.digest)
        bar = self._bars.get(key)
        if bar is None:
            bar = tqdm(
                total=event.total,
                desc=event.status,  # "pulling <12 hex>", as Ollama says it
                unit="B",
                unit_scale=True,
                unit_divisor=1024,
                file=self.stream,
                leave=True,
                dynamic_ncols=True,
            )
            self._bars[key] = bar
        if event.completed is not None and event.completed != bar.n:
            bar.update(event.completed - bar.n)
        if event.completed == event.total and not bar.disable:
            bar.refresh()

    def close(self) -> None:
        with self._lock:
            for bar in self._bars.values():
                bar.close()
            self._bars.clear()


def make_reporter(as_json: bool, stdout: TextIO | None = None, stderr: TextIO | None = None) -> Reporter:
    """JSON lines on stdout with --json; bars when stderr, where they are drawn, is a terminal;
    plain lines on stdout otherwise (a log gets no carriage returns or escape codes)."""
    stdout, stderr = stdout or sys.stdout, stderr or sys.stderr  # None when started with the stream closed
    if as_json:
        return JsonReporter(stdout)
    if stderr is not None and stderr.isatty():
        return BarReporter(stderr)
    return LineReporter(stdout)
