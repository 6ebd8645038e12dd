"""Models loaded on demand, as Ollama's scheduler loads them (server/sched.go): the first request for a
model waits for its load (others for the same model share it), each stays for its keep_alive after
its last request, at most max_loaded at once, and when a new one does not fit beside the loaded ones
the idle ones are unloaded first, least recently used. A model that cannot fit at all is refused
with the memory plan's words."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from ollama_spec.engine.engine import Engine
from ollama_spec.errors import (
    InsufficientMemory,
    InvalidModelName,
    ModelNotFound,
    OllamaSpecError,
    one_line,
)
from ollama_spec.models.gguf_info import format_bytes
from ollama_spec.planning.devices import Device
from ollama_spec.server.core.errors import ApiError
from ollama_spec.server.core.keep_alive import DEFAULT_KEEP_ALIVE
from ollama_spec.server.core.loaded import Served
from ollama_spec.server.metrics import Metrics
from ollama_spec.server.pairs import PairPlan, StorePairs

log = logging.getLogger("ollama_spec.server")
MODELS_PER_GPU = 3  # Ollama's defaultModelsPerGPU, when OLLAMA_MAX_LOADED_MODELS is unset
REAP_SECONDS = 0.2  # how often expired models are looked for
WAIT_SECONDS = 0.1  # how often a load waiting for a busy model to finish looks again


@dataclass(frozen=True)
class SchedulerSettings:
    keep_alive: float = DEFAULT_KEEP_ALIVE  # OLLAMA_KEEP_ALIVE, for requests that give none
    max_loaded: int = 0  # OLLAMA_MAX_LOADED_MODELS; 0: 3 per GPU (3 on a CPU)
    memory_budget: int | None = None  # bytes each device may hold for the models (tests; a shared GPU)
    load_timeout: float = 300.0  # how long a load waits for busy models to make room (OLLAMA_LOAD_TIMEOUT)


def not_found(name: str) -> ApiError:
    return ApiError(404, f'model "{name}" not found, try pulling it first')  # Ollama's words


class Scheduler:
    """The loaded pairs by stored name."""

    def __init__(self, pairs: StorePairs, settings: SchedulerSettings, metrics: Metrics, max_queue: int):
        self.pairs, self.settings, self.metrics, self.max_queue = pairs, settings, metrics, max_queue
        self.loaded: dict[str, Served] = {}
        self._loading: dict[str, asyncio.Future[Served]] = {}
        self._wanted: Counter[str] = Counter()  # requests waiting for a load: their model is not evicted
        self._lock: asyncio.Lock | None = None
        self._reaper: asyncio.Task | None = None
        self._devices: tuple[list[Device], list[str]] | None = None
        # called with a model's stored name before it loads: serve --upstream asks the daemon to let go of it
        self.before_load: Callable[[str], Awaitable[object]] | None = None

    async def canonical(self, name: str) -> str:
        """The stored name for a requested one: 404 as Ollama answers when the store has none."""
        try:
            return await asyncio.to_thread(self.pairs.canonical, name)
        except (ModelNotFound, InvalidModelName):
            raise not_found(name) from None
        except OllamaSpecError as exc:
            raise ApiError(500, one_line(str(exc))) from None

    async def acquire(self, name: str, keep_alive: float | None) -> Served:
        """The loaded pair for `name`, loaded now if need be; the caller holds it (`users`) until `release`."""
        key = await self.canonical(name)
        self._start_reaper()
        self._wanted[key] += 1
        try:
            served = self.loaded.get(key)
            if served is None or served.closed:
                future = self._loading.get(key)
                if future is None:
                    future = self._loading[key] = asyncio.ensure_future(self._load(key))
                    future.add_done_callback(lambda _: self._loading.pop(key, None))
                served = await asyncio.shield(future)
        finally:
            self._wanted[key] -= 1
        served.users += 1
        served.keep_alive = self.settings.keep_alive if keep_alive is None else keep_alive
        served.touch()
        return served

    async def release(self, served: Served) -> None:
        """A request that held `served` ended: its keep_alive counts from now (0: unloaded at once)."""
        served.users -= 1
        served.touch()
        if served.keep_alive == 0 and served.idle and self.loaded.get(served.name) is served:
            await self._unload(served, "keep_alive 0")

    async def unload(self, name: str, wait: float = 30.0) -> bool:
        """Unload `name` if it is loaded (after its running requests end, waiting up to `wait` seconds);
        False if it was not loaded."""
        try:
            key = await asyncio.to_thread(self.pairs.canonical, name)
        except OllamaSpecError:
            key = name
        served = self.loaded.get(key)
        if served is None:
            return False
        served.keep_alive = 0
        deadline = time.monotonic() + wait
        while not served.idle and time.monotonic() < deadline:
            await asyncio.sleep(WAIT_SECONDS)
        if self.loaded.get(key) is served:
            await self._unload(served, "asked to")
        return True

    def shutdown(self) -> None:
        """Unload everything now, from outside the event loop (the server has stopped)."""
        if self._reaper is not None:
            self._reaper.cancel()
        for served in list(self.loaded.values()):
            self.loaded.pop(served.name, None)
            served.close()

    def cancel_all(self) -> None:
        for served in list(self.loaded.values()):
            served.worker.cancel_all()

    # --- loading ---------------------------------------------------------------------------------

    async def _load(self, key: str) -> Served:
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:  # one load at a time, as Ollama's scheduler
            if self.before_load is not None:  # before the plan: the devices are first measured there
                await self.before_load(key)
            pair = await self._plan(key)
            await self._make_room(pair)
            started = time.monotonic()
            try:
                engine = await asyncio.to_thread(self._open, pair)
            except OllamaSpecError as exc:
                raise _refusal(exc) from None
            served = Served(
                engine,
                pair.settings,
                self.metrics,
                name=pair.name,
                draft_why=pair.draft_why,
                keep_alive=self.settings.keep_alive,
                memory=(pair.plan.gpu_bytes, pair.plan.host_bytes) if pair.plan else (0, 0),
            )
            served.touch()
            self.loaded[key] = served
            log.info(
                "loaded %s in %.1f s: context %d (%s), %d slot%s, draft: %s",
                key,
                time.monotonic() - started,
                engine.target.n_ctx,
                pair.ctx_why,
                engine.slots,
                "" if engine.slots == 1 else "s",
                pair.draft_why,
            )
            return served

    def _open(self, pair: PairPlan) -> Engine:
        engine = Engine(pair.target, pair.draft, pair.engine, notice=log.info)
        try:
            engine.costs.prepare(pair.settings.speculation)
        except BaseException:
            engine.close()
            raise
        return engine

    async def _plan(self, key: str) -> PairPlan:
        """The pair and its context, planned against the whole of the (budgeted) machine: what cannot fit
        even alone is refused here, before anything is unloaded for it."""
        try:
            devices, notes = await asyncio.to_thread(self._machine)
            pair = await asyncio.to_thread(self.pairs.plan, key, devices, notes)
        except ModelNotFound as exc:
            raise ApiError(404, one_line(str(exc))) from None
        except OllamaSpecError as exc:
            raise _refusal(exc) from None
        return replace(pair, settings=replace(pair.settings, max_queue=self.max_queue))

    async def _make_room(self, pair: PairPlan) -> None:
        """Unload idle models, least recently used first, until `pair` fits beside the rest; wait for busy
        ones to become idle (up to load_timeout)."""
        deadline = time.monotonic() + self.settings.load_timeout
        while not self._room_for(pair):
            idle = [s for s in self.loaded.values() if s.idle and not self._wanted[s.name]]
            if idle:
                victim = min(idle, key=lambda s: s.last_used)
                await self._unload(victim, f"to make room for {pair.name}")
                continue
            if time.monotonic() > deadline:
                raise ApiError(503, f"{pair.name} cannot load: the loaded models stayed busy; retry later")
            await asyncio.sleep(WAIT_SECONDS)

    def _room_for(self, pair: PairPlan) -> bool:
        if len(self.loaded) >= self._max_loaded():
            return False
        if pair.plan is None or not self.loaded:
            return True
        devices, notes = self._machine()
        left = self._left(devices)
        from ollama_spec.engine.engine import plan_pair

        plan = plan_pair(pair.target, pair.draft, pair.engine, pair.engine.parallel or 1, left, notes)
        return plan.fits

    def _max_loaded(self) -> int:
        if self.settings.max_loaded > 0:
            return self.settings.max_loaded
        gpus = [d for d in self._machine()[0] if d.is_gpu]
        return MODELS_PER_GPU * max(len(gpus), 1)

    def _machine(self) -> tuple[list[Device], list[str]]:
        """This machine's devices as first seen (before any load), each capped at the memory budget."""
        if self._devices is None:
            from ollama_spec.llama import backends

            devices, notes = backends.discover_devices()
            if (budget := self.settings.memory_budget) is not None:
                devices = [replace(d, total=min(d.total, budget), free=min(d.free, budget)) for d in devices]
                notes = [*notes, f"memory budget: {format_bytes(budget)} a device"]
            self._devices = (devices, notes)
        return self._devices

    def _left(self, devices: list[Device]) -> list[Device]:
        """`devices` less what the loaded pairs' plans counted: GPU bytes from the GPUs in order, RAM from RAM."""
        gpu = sum(s.memory[0] for s in self.loaded.values())
        host = sum(s.memory[1] for s in self.loaded.values())
        left = []
        for device in devices:
            taken = host if not device.is_gpu else min(gpu, device.free)
            if device.is_gpu:
                gpu -= taken
            left.append(replace(device, free=max(device.free - taken, 0)))
        return left

    async def _unload(self, served: Served, why: str) -> None:
        if self.loaded.get(served.name) is served:
            del self.loaded[served.name]
        log.info("unloading %s (%s)", served.name, why)
        await asyncio.to_thread(served.close)

    # --- expiry ----------------------------------------------------------------------------------

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self._reap())

    async def _reap(self) -> None:
        """Unload the idle models whose keep_alive has run out."""
        while True:
            await asyncio.sleep(REAP_SECONDS)
            now = time.time()
            for served in list(self.loaded.values()):
                if served.idle and not self._wanted[served.name] and served.expires_at <= now:
                    await self._unload(served, "its keep_alive ran out")

    def expires(self, served: Served) -> float:
        """When `served` is unloaded if it stays idle (time.time()); inf while in use or kept forever."""
        return math.inf if served.users else served.expires_at


def _refusal(exc: OllamaSpecError) -> ApiError:
    """A model that cannot run as Ollama answers it: too big for this machine is a 500 in the memory plan's
    words; anything else about the model (not usable, a draft that does not fit it) a 400."""
    status = 500 if isinstance(exc, InsufficientMemory) else 400
    return ApiError(status, one_line(str(exc)))
