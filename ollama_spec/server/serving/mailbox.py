"""Events for the jobs of one asyncio loop, handed over from the step loop's thread (`Mailbox`)."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any, Protocol


class Job(Protocol):
    """A job as its mailbox sees it (worker.Job): where its events go, and its cancel."""

    _events: asyncio.Queue

    def cancel(self) -> None: ...


Event = Any  # worker.Event: a Piece, Finished or Failed

# While a stream's pieces come faster than this, the event loop collects them by a timer of its own
# this often instead of being woken for each step: each wake-up is a syscall on the step loop's thread
# and a turn at the GIL for the event loop's, and once a step on a pair whose steps take a fraction of
# a millisecond, it is most of what the event loop's thread spends a token.
POLL_S = 0.002


class Mailbox:
    """Events for the jobs of one asyncio loop, put from the step loop's thread. Each wake-up of the loop
    brings all that is waiting, for all its jobs. Once two wake-ups come within POLL_S of each other, the
    loop looks again every POLL_S by a timer (until a look finds nothing): the pieces put meanwhile wait
    for it, and only a job's first piece and its end wake the loop. A stream's chunks still come as
    often as a person could see them change; a slow pair's pieces each wake the loop at once."""

    def __init__(self, loop: asyncio.AbstractEventLoop, poll_s: float = POLL_S):
        self.loop, self.poll_s = loop, poll_s
        self._lock = threading.Lock()
        self._mail: list[tuple[Job, tuple[Event, ...]]] = []
        self._waking = False  # a wake-up is due on the loop and has not been delivered
        self._polling = False  # the loop's timer will look within poll_s
        self._woken_at = -math.inf  # the loop's time at the last wake-up

    def put(self, job: Job, events: tuple[Event, ...], urgent: bool = True) -> None:
        """Hand `events` to `job` on its loop: at once if `urgent`, else by the loop's next look."""
        with self._lock:
            self._mail.append((job, events))
            if self._waking or (self._polling and not urgent and not self.loop.is_closed()):
                return
            self._waking = True
        try:
            self.loop.call_soon_threadsafe(self._woken)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            for waiting, _ in self._take():
                waiting.cancel()

    def _take(self) -> list[tuple[Job, tuple[Event, ...]]]:
        with self._lock:
            self._waking = False
            mail, self._mail = self._mail, []
        return mail

    def _woken(self) -> None:
        self._deliver(self._take())
        now = self.loop.time()
        soon, self._woken_at = now - self._woken_at < self.poll_s, now
        with self._lock:
            if self._polling or not soon:
                return
            self._polling = True
        self.loop.call_later(self.poll_s, self._look)

    def _look(self) -> None:
        """The timer: what came since the last delivery, and another look soon if anything had."""
        with self._lock:
            mail, self._mail = self._mail, []
            self._polling = bool(mail)
        if mail:
            self._deliver(mail)
            self.loop.call_later(self.poll_s, self._look)

    @staticmethod
    def _deliver(mail: list[tuple[Job, tuple[Event, ...]]]) -> None:
        for job, events in mail:
            for event in events:
                job._events.put_nowait(event)
