"""Was this process kept waiting for a CPU while a timing ran? A timing that other processes shared the
cores with says what the machine did in that spell, not what the pair costs: the step costs
(engine/costs.py) and the flash-attention choice (engine/flash_choice.py) timed so are used by this
process only, never cached, so the next load times them again.

Linux counts, per thread, the nanoseconds it was runnable but waited on a run queue
(`/proc/self/task/*/schedstat`, its second field): the process's threads' waits, summed over a timing,
against the timing's wall time. Where that count is not kept (another OS), every timing counts as quiet.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

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
