"""What most commands share beside their options: the store they read, JSON out, notes on stderr."""

from __future__ import annotations

import json
import shutil
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TextIO

import click

if TYPE_CHECKING:
    from ollama_spec.models.store import Store

PLAIN_EVERY_S = 3.0  # not a terminal: at most one line a step this often (its first always shows)
TICK_S = 4.0  # a step the CLI waits on says how long it has taken this often (never 15 s silent)


def open_store(models_dir: str | None) -> Store:
    from ollama_spec.models.store import Store, find_store_root  # loaded when a command reads the store

    return Store(find_store_root(models_dir))


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


class Notes:
    """Notes on stderr about something that takes a moment (the engine's `notice`, a build's progress).

    A note whose words before its first ": " are the last note's is that step's progress: on a terminal
    it rewrites the last note in place (a step prints nothing else while it reports); in a log or a pipe
    it is a plain line, at most one every PLAIN_EVERY_S, so a log shows the step moving, not each tick.
    Only stderr: what a command prints for data on stdout (text, --json) never gets a note."""

    def __init__(self, prefix: str = "note: ", stream: TextIO | None = None):
        self.prefix, self.stream = prefix, stream  # None: sys.stderr as it is at each note (CliRunner swaps it)
        self._lock = threading.Lock()  # a ticking() thread writes beside the main one
        self._stem: str | None = None
        self._shown, self._shown_at = "", float("-inf")

    def __call__(self, text: str) -> None:
        stem = text.split(": ", 1)[0]
        with self._lock:
            stream = self.stream or sys.stderr
            tty = _isatty(stream)
            now, going_on = time.monotonic(), stem == self._stem
            if going_on and not tty and now - self._shown_at < PLAIN_EVERY_S:
                return
            line = self.prefix + text
            up = ""
            if going_on and tty:  # up over the rows the last note took (a long one wraps), and clear them
                rows = -(-len(self._shown) // max(shutil.get_terminal_size((100, 20)).columns, 1))
                up = f"\033[{max(rows, 1)}F\033[J"
            click.echo(up + line, file=stream)
            self._stem, self._shown, self._shown_at = stem, line, now

    @contextmanager
    def ticking(self, doing: str, every: float | None = None) -> Iterator[None]:
        """While the block runs: `doing` and the time it has taken, every `every` seconds (TICK_S), the
        first after `every` (a step done sooner says nothing); then how long it took, if it said anything."""
        every = TICK_S if every is None else every
        start, stop, said = time.monotonic(), threading.Event(), []

        def tick() -> None:
            while not stop.wait(every):
                self(f"{doing}: {time.monotonic() - start:.0f} s so far")
                said.append(True)

        thread = threading.Thread(target=tick, name="notes-ticking", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            if said:
                self(f"{doing} took {time.monotonic() - start:.0f} s")


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or a stand-in without isatty
        return False


notice = Notes()  # a note on stderr about something that takes a moment (the engine's `notice`)
