"""Host memory for a sequence's saved cells, its pages faulted in before a save needs them.

A slot's prefix saved to host RAM (engine/slots.py) is tens of MB (53 MB for the demo target's 2,000
tokens; a 70B model's is hundreds), which llama.cpp writes into memory the kernel hands over a page at
a time as it is first touched: on the 2-core VM such a save took 40-200 ms of the step loop's thread,
every slot's pass waiting, and 5.4 ms into memory already touched. So each model keeps one spare
region as large as the largest save it may have to make next: of the cache of a free slot, any of them
(`expect`: told when a slot is freed, and `drop` when it is taken again),
its pages touched by a thread of its own (in a foreign call, the GIL let go); a save takes it
(`take`), the thread gives back the pages past what the save wrote and prepares the next one. A save
larger than the spare is written to fresh memory, as without it. The pages are touched one fault at a
time, not with MAP_POPULATE: that holds the process's memory map for the whole region, and the loop
thread's own faults and allocations stalled behind it for up to 170 ms. The thread runs at the lowest
priority (where the system lets a thread have its own): on a machine whose cores the passes fill, it
touches its pages between them; at llama.cpp's, a lone request's 47-token pass beside it took
440-490 ms against 330-350.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import threading

PAGE = mmap.PAGESIZE
_FLAGS = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)
# A spare more than this many times the largest save expected is made again at that size: one long
# prefix freed once does not keep its size of memory held for good
SHRINK_PAST = 2
LOWEST_PRIORITY = 19  # the thread's nice value: it touches its pages where the passes leave a core idle
# Saves smaller than this go to fresh memory, with no thread: they fault in within a few milliseconds,
# and the thread's wake-ups and its turns at the GIL cost the tiny pair's stream (a request of ~15 ms,
# its slot saved at each) 10 % of its tokens a second (K=3 against llama-speculative-simple: 0.78-0.82
# against 0.85-0.94 before, 3 runs alternated)
MIN_READY_BYTES = 4 * 1024 * 1024


class HostMemory:
    """One model's spare region for its next save (see the module)."""

    def __init__(self) -> None:
        self._expected: dict[int, int] = {}  # the bytes of each save that may come, by sequence
        self._wanted = 0  # the size of spare to have ready: the largest of them
        self._spare: mmap.mmap | None = None
        self._trims: list[tuple[mmap.mmap, int]] = []  # regions taken, and the bytes of each that a save uses
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False

    @property
    def spare(self) -> int:
        """The bytes ready now (0: none)."""
        spare = self._spare
        return 0 if spare is None else len(spare)

    def expect(self, seq: int, size: int, most: int) -> None:
        """A save of sequence `seq`, `size` bytes, may come: have a spare that large ready (the thread
        makes it), unless it is past `most` (what a save may take) or under MIN_READY_BYTES."""
        with self._changed:
            if self._closed or not _FLAGS:
                return
            if MIN_READY_BYTES <= size <= most:
                self._expected[seq] = size
            else:
                self._expected.pop(seq, None)
            self._wanted = max(self._expected.values(), default=0)
            if self._thread is None and self._expected:
                self._thread = threading.Thread(target=self._run, name="ollama-spec-host-memory", daemon=True)
                self._thread.start()
            if self._due():  # else its thread sleeps on: a wake-up is a turn at the GIL
                self._changed.notify()

    def drop(self, seq: int) -> None:
        """Sequence `seq` will not be saved as it is (its slot is taken)."""
        with self._changed:
            if self._expected.pop(seq, None) is not None:
                self._wanted = max(self._expected.values(), default=0)
                if self._due():
                    self._changed.notify()

    def take(self, size: int) -> bytearray | memoryview:
        """`size` writable bytes for a save: the spare where it is that large, else fresh memory."""
        with self._changed:
            spare = self._spare
            if spare is None or len(spare) < size:
                return bytearray(size)
            self._spare = None
            if len(spare) - size >= PAGE:
                self._trims.append((spare, size))
            self._changed.notify()
        return memoryview(spare)[:size]

    def close(self) -> None:
        """Stop the thread; the spare goes (the regions saves took stay theirs)."""
        with self._changed:
            self._closed, self._spare = True, None
            self._changed.notify()
        if self._thread is not None:
            self._thread.join()

    def _due(self) -> bool:
        """Is there work for the thread (under the lock)?"""
        return self._closed or bool(self._trims) or bool(self._to_make())

    def _to_make(self) -> int:
        """The size of spare the thread is to make now, 0 for none (under the lock)."""
        spare, wanted = self.spare, self._wanted
        return wanted if spare < wanted or spare > SHRINK_PAST * wanted else 0

    def _run(self) -> None:
        with contextlib.suppress(AttributeError, OSError):  # Linux: a thread's own nice value
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), LOWEST_PRIORITY)
        while True:
            with self._changed:
                while not self._due():
                    self._changed.wait()
                if self._closed:
                    return
                trims, self._trims, size = self._trims, [], self._to_make()
            for region, used in trims:  # the pages past a save's bytes go back to the system
                start = -(-used // PAGE) * PAGE
                if start < len(region):
                    region.madvise(mmap.MADV_DONTNEED, start, len(region) - start)
            if size:
                region = touched(size)
                with self._changed:
                    if not self._closed:
                        self._spare = region


def touched(size: int) -> mmap.mmap:
    """`size` bytes of anonymous memory, every page faulted in."""
    region = mmap.mmap(-1, size, flags=_FLAGS)
    view = (ctypes.c_uint8 * size).from_buffer(region)
    ctypes.memset(view, 0, size)  # a foreign call: the GIL let go meanwhile
    del view
    return region
