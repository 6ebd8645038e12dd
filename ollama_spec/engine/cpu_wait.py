"""Was this process kept waiting for a CPU while a timing ran? A timing that other processes shared the
cores with says what the machine did in that spell, not what the pair costs: the step costs
(engine/costs.py) and the flash-attention choice (engine/flash_choice.py) timed so are used by this
process only, never cached, so the next load times them again.

Linux counts, per thread, the nanoseconds it was runnable but waited on a run queue
(`/proc/self/task/*/schedstat`, its second field): the process's threads' waits, summed over a timing,
against the timing's wall time. Where that count is not kept (another OS), every timing counts as quiet.

The step loop prices its passes on a clock that stops while its own thread waits (`running_clock`): a pass
is priced by the time its thread ran or slept, not by the slices other processes took from it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

try:
    import resource

    _RUSAGE_THREAD = getattr(resource, "RUSAGE_THREAD", None)  # Linux's: one thread's own counts
except ImportError:  # (Windows)
    _RUSAGE_THREAD = None

# A timing whose threads waited, summed, this share of its wall time or more ran on a busy machine. Quiet,
# the demo pair's 2 threads on 2 cores wait ~0-3 % (the odd daemon); one process spinning beside them makes
# three runnable threads on two cores: each waits about a third of the time, together ~60 %.
BUSY_SHARE = 0.15
TASKS = "/proc/self/task"


def waited_s() -> float | None:
    """Seconds this process's threads have waited for a CPU while runnable, summed; None where unknown."""
    try:
        tasks = os.listdir(TASKS)
    except OSError:
        return None
    total = 0
    for task in tasks:
        try:
            with open(f"{TASKS}/{task}/schedstat") as stat:
                total += int(stat.read().split()[1])
        except (OSError, ValueError, IndexError):
            continue  # a thread that ended meanwhile
    return total / 1e9


# A reading of a thread's waits is taken between two of the clock's: where those lie this far apart, a wait
# may have come between the reading and either, and it is taken again (at most READ_TRIES times in all).
CLEAN_READ_S = 20e-6
READ_TRIES = 3


class _Thread:
    """The calling thread's own schedstat, kept open (one pread a reading: ~1 us, against ~10 us to open it
    each time; closed when the thread ends and its thread-local goes), and the clock read beside it."""

    def __init__(self) -> None:
        try:
            self.fd = os.open(f"{TASKS}/{threading.get_native_id()}/schedstat", os.O_RDONLY)
        except OSError:
            self.fd = -1
        self.clock = self.waited = self.lost = 0.0
        self.started = False
        self.switches = -1  # the thread's context switches at its last reading of the waits
        self.read = 0.0  # that reading

    def __del__(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


_own = threading.local()


def _thread() -> _Thread:
    own = getattr(_own, "thread", None)
    if own is None:
        own = _own.thread = _Thread()
    return own


def thread_waited_s() -> float | None:
    """Seconds the calling thread has waited for a CPU while runnable; None where that is not counted.

    The count moves only when the thread comes back to a core, so only after a context switch: where the
    thread's switches (getrusage, ~0.5 us) are as at its last reading, so are its waits (~1.3 us to read)."""
    own = _thread()
    if own.fd < 0:
        return None
    if _RUSAGE_THREAD is not None:
        usage = resource.getrusage(_RUSAGE_THREAD)
        switches = usage.ru_nvcsw + usage.ru_nivcsw
        if switches == own.switches:
            return own.read
        own.switches = switches
    try:
        own.read = int(os.pread(own.fd, 64, 0).split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None
    return own.read


def running_clock(clock: Callable[[], float]) -> float:
    """`clock()` less the seconds the calling thread has waited for a CPU since its first reading: a clock that
    stands still while other processes hold the thread's core. Between two readings it tells the time the
    thread ran or slept. Its waits are read between two of `clock`'s, and only when those lie close (a wait
    that came between the reading and the clock's would be taken from the time before or after it)."""
    before, waited, now = clock(), thread_waited_s(), clock()
    tries = 1
    while now - before >= CLEAN_READ_S and tries < READ_TRIES:
        before, waited, now = clock(), thread_waited_s(), clock()
        tries += 1
    own = _thread()
    if waited is None:
        return now - own.lost
    if own.started:  # never more than the time gone by: a reading taken too late can only say too much
        own.lost += max(0.0, min(waited - own.waited, now - own.clock))
    own.clock, own.waited, own.started = now, waited, True
    return now - own.lost


@dataclass
class CpuWait:
    """`with CpuWait() as wait: ...`: afterwards `wait.share` (the threads' waits ÷ the block's wall time)
    and `wait.busy`."""

    share: float = 0.0
    _start: tuple[float, float | None] = (0.0, None)

    def __enter__(self) -> CpuWait:
        self._start = (time.perf_counter(), waited_s())
        return self

    def __exit__(self, *exc) -> None:
        start, waited = self._start
        now, wall = waited_s(), time.perf_counter() - start
        if waited is not None and now is not None and wall > 0:
            self.share = max(0.0, now - waited) / wall  # a thread that ended takes its waits along: never < 0

    @property
    def busy(self) -> bool:
        return self.share >= BUSY_SHARE

    def __str__(self) -> str:
        return f"its threads waited {self.share:.0%} of its time for a CPU"
