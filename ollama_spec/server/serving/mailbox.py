"""Events for the jobs of one asyncio loop, handed over from the step loop's thread (`Mailbox`)."""

from __future__ import annotations

import asyncio
import ctypes
import math
import os
import threading
import weakref
from collections.abc import Callable
from typing import Any, Protocol


class Job(Protocol):
    """A job as its mailbox sees it (worker.Job): its events taken on the loop's thread, and its cancel."""

    def take(self, events: tuple[Any, ...]) -> None: ...

    def cancel(self) -> None: ...


Event = Any  # worker.Event: a Piece, Finished or Failed

# While a stream's pieces come faster than this, the event loop collects them by a timer of its own
# this often instead of being woken for each step: each wake-up is a syscall on the step loop's thread
# and a turn at the GIL for the event loop's, and once a step on a pair whose steps take a fraction of
# a millisecond, it is most of what the event loop's thread spends a token. Each look that finds text
# is a chunk written, and each chunk wakes the client to read it: on a machine whose cores are all
# busy, CPU time the step loop's thread waits for. As often as a 120 Hz screen changes.
POLL_S = 0.008


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
        self._wakeup = Wakeup(loop, self._woken)

    def put(self, job: Job, events: tuple[Event, ...], urgent: bool = True) -> None:
        """Hand `events` to `job` on its loop: at once if `urgent`, else by the loop's next look."""
        with self._lock:
            self._mail.append((job, events))
            if self._waking or (self._polling and not urgent and not self.loop.is_closed()):
                return
            self._waking = True
        try:
            self._wakeup()
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
            job.take(events)


def _write_holding_the_gil() -> Callable[[int, bytes, int], int] | None:
    """libc's write(2) through ctypes.PyDLL, whose calls keep the GIL; None where there is no libc to ask
    (Windows)."""
    if os.name != "posix":
        return None
    try:
        write = ctypes.PyDLL(None).write
    except (OSError, AttributeError):
        return None
    write.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
    write.restype = ctypes.c_ssize_t
    return write


_WRITE = _write_holding_the_gil()


class Wakeup:
    """Wakes an asyncio loop from another thread, as call_soon_threadsafe does, but without letting go of
    the GIL: a byte written to a pipe the loop watches, by a call that keeps the GIL.

    call_soon_threadsafe sends its byte through a socket, and a socket's send lets go of the GIL: the loop's
    thread, woken on another core, often takes it then, and the step loop's thread waits while the loop
    frames and writes the answers' chunks (a wake-up cost the step loop 0.16 ms at the median and 2.4 ms at
    the 90th percentile on a busy 2-core machine, on a pair whose whole step takes 0.3 ms). Woken this way,
    the loop's thread gets the GIL when the step loop next lets go of it, in llama_decode, and runs beside
    that pass. A loop that cannot watch a pipe (Windows' proactor) is woken by call_soon_threadsafe."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]):
        """Made on the loop's thread."""
        self.loop, self._callback = loop, callback
        self._pipe: tuple[int, int] | None = None
        if _WRITE is None:
            return
        read, write = os.pipe()
        try:
            os.set_blocking(read, False)
            os.set_blocking(write, False)
            loop.add_reader(read, self._read)
        except (NotImplementedError, OSError):
            os.close(read)
            os.close(write)
            return
        self._pipe = (read, write)
        # the loop holds this object while it watches the pipe: it goes, and the pipe with it, once the
        # loop is closed and its mailbox dropped
        weakref.finalize(self, _close, read, write)

    def __call__(self) -> None:
        """Wake the loop: its callback runs on its thread. RuntimeError when the loop is closed."""
        if self._pipe is None:
            self.loop.call_soon_threadsafe(self._callback)
        elif self.loop.is_closed():
            raise RuntimeError("the event loop is closed")
        else:
            _WRITE(self._pipe[1], b"\0", 1)  # -1 only when the pipe is full: a wake-up is waiting already

    def _read(self) -> None:
        try:
            os.read(self._pipe[0], 4096)
        except BlockingIOError:
            pass
        self._callback()


def _close(*fds: int) -> None:
    for fd in fds:
        os.close(fd)
