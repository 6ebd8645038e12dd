"""The pairs the store's scheduler holds in memory (serving/scheduler.py): the loaded ones by stored name, the
retiring ones until their last request ends, the one lock over both, and the waits on them. Nothing here
polls: a change (a pair became idle, one closed, a request stopped waiting for a model) wakes whoever waits
for one (`Signal`), and each pair is unloaded when its keep_alive runs out, on its time."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter

from ollama_spec.server.serving.loaded import Served

log = logging.getLogger("ollama_spec.server")


class Signal:
    """Wakes every waiter at the next change; each then checks again what it waits for. A waiter checks and
    starts waiting with no await between, so on the event loop no change falls between the two."""

    def __init__(self) -> None:
        self._event: asyncio.Event | None = None  # made on the loop that waits

    def notify(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = None

    async def wait(self, timeout: float | None) -> None:
        """Until the next change, or `timeout` seconds (None: until the next change)."""
        if self._event is None:
            self._event = asyncio.Event()
        try:
            await asyncio.wait_for(self._event.wait(), timeout)
        except TimeoutError:
            pass


class Resident:
    """The pairs in memory, and the one lock under which they are loaded, evicted, unloaded and closed. A pair
    leaves `loaded` to be unloaded; while requests still use it, it waits in `unloading`, still counted as
    taking its memory, and closes when the last of them ends. `wanted`: requests waiting for a load, by
    stored name: their model is neither evicted nor expired."""

    def __init__(self) -> None:
        self.loaded: dict[str, Served] = {}
        self.unloading: list[Served] = []  # out of `loaded`, closed when their requests end
        self.wanted: Counter[str] = Counter()
        self.changed = Signal()
        self._lock: asyncio.Lock | None = None
        self._expiry: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()  # settling pairs the worker found idle

    def locked(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def taking(self) -> list[Served]:
        """Every pair in memory: the loaded ones and those retiring."""
        return [*self.loaded.values(), *self.unloading]

    def watch(self, served: Served) -> None:
        """Settle `served` whenever its worker runs dry (its last job may end after its last request let go)."""
        loop = asyncio.get_running_loop()

        def settle_soon() -> None:
            task = asyncio.ensure_future(self.settle(served))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        def idle() -> None:  # on the thread the job ended on
            try:
                loop.call_soon_threadsafe(settle_soon)
            except RuntimeError:  # the loop has closed: the server has stopped
                pass

        served.worker.on_idle = idle

    async def settle(self, served: Served) -> None:
        """`served` may have become idle: wake the waiters; a retiring pair closes with its last request, one
        with keep_alive 0 unloads at once."""
        self.changed.notify()
        if not served.idle or (served not in self.unloading and served.keep_alive != 0):
            return
        async with self.locked():
            if served in self.unloading:
                await self.close_retired()
            elif served.keep_alive == 0 and served.idle and self.loaded.get(served.name) is served:
                await self.unload(served, "keep_alive 0")

    async def unload(self, served: Served, why: str) -> None:
        """Take `served` out of `loaded` and close it, now if idle, else when its requests end. Under the lock."""
        if self.loaded.get(served.name) is served:
            del self.loaded[served.name]
        if served.idle:
            log.info("unloading %s (%s)", served.name, why)
            await self._close(served)
        else:
            log.info("unloading %s when its running requests end (%s)", served.name, why)
            served.unloading_since = time.time()
            self.unloading.append(served)

    async def close_retired(self) -> None:
        """Close the retiring pairs whose last request has ended. Under the lock."""
        for served in [s for s in self.unloading if s.idle]:
            self.unloading.remove(served)
            log.info("unloading %s: its last request ended", served.name)
            await self._close(served)

    async def _close(self, served: Served) -> None:
        served.closed = True  # at once, on the loop: a request resuming meanwhile looks for another pair
        await asyncio.to_thread(served.close)
        self.changed.notify()  # its memory is free

    # --- expiry ----------------------------------------------------------------------------------

    def start_expiry(self) -> None:
        """Start unloading pairs as their keep_alive runs out (on the running loop, once)."""
        if self._expiry is None or self._expiry.done():
            self._expiry = asyncio.ensure_future(self._expire())

    def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()

    async def _expire(self) -> None:
        """Unload each idle pair when its keep_alive runs out, and close retiring ones left idle: asleep until
        the first one is due, or until a change (a release restarts a pair's keep_alive)."""
        while True:
            if self._expired() or any(s.idle for s in self.unloading):
                async with self.locked():
                    await self.close_retired()
                    for served in self._expired():
                        await self.unload(served, "its keep_alive ran out")
                continue
            due = min((s.expires_at for s in self._expiring()), default=math.inf)
            await self.changed.wait(None if math.isinf(due) else max(due - time.time(), 0.0))

    def _expiring(self) -> list[Served]:
        return [s for s in self.loaded.values() if s.idle and not self.wanted[s.name]]

    def _expired(self) -> list[Served]:
        now = time.time()
        return [s for s in self._expiring() if s.expires_at <= now]
