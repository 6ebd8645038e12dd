"""Models loaded on demand, as Ollama's scheduler loads them (server/sched.go): the first request for a
model waits for its load (others for the same model share it), each stays for its keep_alive after
its last request, at most max_loaded at once, and when a new one does not fit beside the loaded ones
the idle ones are unloaded first, least recently used. A model that cannot fit at all is refused
with the memory plan's words."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from ollama_spec.engine.engine import Engine, pair_facts
from ollama_spec.errors import (
    Busy,
    InsufficientMemory,
    InvalidModelName,
    InvalidRequest,
    ModelNotFound,
    OllamaSpecError,
    ServerFault,
    StoreNotFound,
    one_line,
)
from ollama_spec.models.gguf_info import format_bytes
from ollama_spec.models.resolve import ResolvedModel
from ollama_spec.planning.context import ContextChoice
from ollama_spec.planning.devices import Device
from ollama_spec.planning.fit import fit_pair
from ollama_spec.server.core.keep_alive import DEFAULT_KEEP_ALIVE
from ollama_spec.server.core.loaded import Served
from ollama_spec.server.metrics import Metrics
from ollama_spec.server.pairs import PairPlan, StorePairs

log = logging.getLogger("ollama_spec.server")
MODELS_PER_GPU = 3  # Ollama's defaultModelsPerGPU, when OLLAMA_MAX_LOADED_MODELS is unset
REAP_SECONDS = 0.2  # how often expired models are looked for
WAIT_SECONDS = 0.1  # how often a load waiting for a busy model to finish looks again
REQUEST_CHOSE = "a request's num_ctx"  # who chose a larger context, unless the caller says
RETRY_AFTER_BUSY = 5  # seconds a client is told to wait when no loaded model became idle in time
DELETE_WAIT_SECONDS = 30.0  # how long a delete waits for its model's cut-short requests to end
T = TypeVar("T")


@dataclass(frozen=True)
class SchedulerSettings:
    keep_alive: float = DEFAULT_KEEP_ALIVE  # OLLAMA_KEEP_ALIVE, for requests that give none
    max_loaded: int = 0  # OLLAMA_MAX_LOADED_MODELS; 0: 3 per GPU (3 on a CPU)
    memory_budget: int | None = None  # bytes each device may hold for the models (tests; a shared GPU)
    load_timeout: float = 300.0  # how long a load waits for busy models to make room (OLLAMA_LOAD_TIMEOUT)


def not_found(name: str) -> ModelNotFound:
    return ModelNotFound(f'model "{name}" not found, try pulling it first')  # Ollama's words


class Scheduler:
    """The loaded pairs by stored name, and the one owner of loading, evicting, unloading and deleting them.

    All four run under one lock, so no load sees room that a closing pair still takes. A pair leaves
    `loaded` when it is evicted, expires, is asked to unload, is deleted or its manifest changes (a copy or
    a pull over its name); while requests still use it, it waits in `unloading`, still counted as taking
    its memory, and closes when the last of them ends (a delete ends them at their next step)."""

    answers_every_name = False  # a name the store cannot run goes to the upstream daemon, when there is one

    def __init__(self, pairs: StorePairs, settings: SchedulerSettings, metrics: Metrics, max_queue: int):
        self.pairs, self.settings, self.metrics, self.max_queue = pairs, settings, metrics, max_queue
        self.loaded: dict[str, Served] = {}
        self.unloading: list[Served] = []  # out of `loaded`, closed when their requests end
        self._loading: dict[str, asyncio.Future[Served]] = {}
        self._wanted: Counter[str] = Counter()  # requests waiting for a load: their model is not evicted
        self._deleting: set[str] = set()  # stored names a delete is removing: requests for them are 404s
        self._lock: asyncio.Lock | None = None
        self._reaper: asyncio.Task | None = None
        self._devices: tuple[list[Device], list[str]] | None = None
        # called with a model's stored name before it loads: serve --upstream asks the daemon to let go of it
        self.before_load: Callable[[str], Awaitable[object]] | None = None

    async def canonical(self, name: str) -> str:
        """The stored name for a requested one: 404 as Ollama answers when the store has none."""
        return (await self._identify(name))[0]

    def can_run(self, name: str) -> bool:
        """Whether `name` is a model of the store that can run here (blocks: run it on a thread)."""
        return self.pairs.can_run(name)

    def has_model(self, name: str) -> bool:
        """Whether the store has `name`: False when it has no such model (or there is no store), True for
        a bad name or a broken manifest too, which the routes answer (blocks: run it on a thread)."""
        try:
            self.pairs.canonical(name)
        except (ModelNotFound, StoreNotFound):
            return False
        except OllamaSpecError:
            pass
        return True

    def listed(self) -> list[tuple[str, ResolvedModel]]:
        """The store's models that can run here by name, newest first, as /api/tags and /v1/models list
        them (blocks: run it on a thread)."""
        return [(model.name, model) for model in self.pairs.runnable()]

    async def describe(self, name: str) -> tuple[Served | None, ResolvedModel, str | None, str]:
        """What /api/show says of `name`: the loaded pair if it is loaded, its model, its draft and why."""
        key = await self.canonical(name)
        served = self.loaded.get(key)
        if served is not None:
            return served, served.engine.target_model, served.proposer_name, served.draft_why
        try:
            model, draft, why = await asyncio.to_thread(self.pairs.describe, key)
        except OllamaSpecError as exc:
            # a delete since the name was found takes its files at any point of the read: not found, as after it
            # (a missing draft is the pair's 400)
            if not await asyncio.to_thread(self.has_model, key):
                raise not_found(name) from None
            raise InvalidRequest(one_line(str(exc))) from None
        return None, model, draft, why

    def health(self) -> dict:
        return {"loaded": list(self.loaded)}

    def __str__(self) -> str:
        return f"the models of {self.pairs.store().path} as they are asked for"

    async def _identify(self, name: str) -> tuple[str, str]:
        """The stored name and its manifest's digest, in one read of the store."""
        try:
            key, digest = await asyncio.to_thread(self.pairs.identify, name)
        except (ModelNotFound, InvalidModelName):
            raise not_found(name) from None
        except OllamaSpecError as exc:
            raise ServerFault(one_line(str(exc))) from None
        if key in self._deleting:
            raise not_found(name)
        return key, digest

    async def acquire(self, name: str, keep_alive: float | None, n_ctx: int | None = None, ctx_why: str = "") -> Served:
        """The loaded pair for `name`, loaded now if need be: again if its manifest changed since, or with a
        larger context when `n_ctx` asks for more than it has (and the memory plan allows it). `ctx_why`:
        who chose `n_ctx` (default: a request's num_ctx), for the log. The caller holds it (`users`) until
        `release`."""
        self._start_reaper()
        while True:  # again if a delete closed the pair between its load and this request's turn
            key, digest = await self._identify(name)
            self._wanted[key] += 1
            try:
                served = self.loaded.get(key)
                if not _answers(served, digest, n_ctx):
                    future = self._loading.get(key)
                    if future is None:
                        future = self._loading[key] = asyncio.ensure_future(self._load(key, digest, n_ctx, ctx_why))
                        future.add_done_callback(lambda _, key=key: self._loading.pop(key, None))
                    served = await asyncio.shield(future)
            finally:
                self._wanted[key] -= 1
            if not served.closed:
                break
        served.users += 1
        served.keep_alive = self.settings.keep_alive if keep_alive is None else keep_alive
        served.touch()
        return served

    async def release(self, served: Served) -> None:
        """A request that held `served` ended: its keep_alive counts from now (0: unloaded at once); a
        retiring pair closes with its last request."""
        served.users -= 1
        served.touch()
        if served.idle and (served in self.unloading or served.keep_alive == 0):
            async with self._locked():
                if served in self.unloading:
                    await self._close_retired()
                elif served.keep_alive == 0 and served.idle and self.loaded.get(served.name) is served:
                    await self._unload(served, "keep_alive 0")

    async def unload(self, name: str) -> bool:
        """Unload `name` if it is loaded: now if idle, else when its running requests end (as Ollama's
        keep_alive 0); False if it was not loaded."""
        try:
            key = await asyncio.to_thread(self.pairs.canonical, name)
        except OllamaSpecError:
            key = name
        async with self._locked():
            served = self.loaded.get(key)
            if served is None:
                return False
            await self._unload(served, "asked to")
        return True

    async def store_changed(self) -> None:
        """The store was written here (a pull, a copy, a delete): list its models afresh, and retire the
        loaded pairs whose manifest changed, so that the next request, and /api/show, see the new model."""
        self.pairs.changed()
        async with self._locked():
            for served in list(self.loaded.values()):
                try:
                    _, digest = await asyncio.to_thread(self.pairs.identify, served.name)
                except OllamaSpecError:
                    digest = None
                if digest != served.manifest_digest:
                    await self._unload(served, "its manifest changed" if digest else "it left the store")

    async def delete(self, name: str, remove: Callable[[str], T]) -> T:
        """Delete the stored `name` with `remove(stored name)` (on a thread), once the pairs that load it (as
        target or draft) have closed: their running requests end at their next step, as Ollama's delete ends
        them (503, nothing deleted, if they have not within DELETE_WAIT_SECONDS). A load in progress finishes
        first; requests for the name meanwhile are 404s, as after the delete."""
        key = await self.canonical(name)
        self._deleting.add(key)
        try:
            async with self._locked():
                for served in [s for s in self.loaded.values() if _loads(s, key)]:
                    await self._unload(served, "its model is being deleted")
            deadline = time.monotonic() + DELETE_WAIT_SECONDS
            while busy := [served for served in self.unloading if _loads(served, key) and not served.closed]:
                for served in busy:
                    served.worker.cancel_all(f'model "{name}" is being deleted')
                if time.monotonic() > deadline:
                    raise Busy(
                        f'model "{name}" is still in use: its requests did not end; retry later', RETRY_AFTER_BUSY
                    )
                await asyncio.sleep(WAIT_SECONDS)
            async with self._locked():
                return await asyncio.to_thread(remove, key)
        finally:
            self._deleting.discard(key)
            self.pairs.changed()

    def shutdown(self) -> None:
        """Unload everything now, from outside the event loop (the server has stopped)."""
        if self._reaper is not None:
            self._reaper.cancel()
        for served in [*self.loaded.values(), *self.unloading]:
            served.close()
        self.loaded.clear()
        self.unloading.clear()

    # --- loading ---------------------------------------------------------------------------------

    def _locked(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _load(self, key: str, digest: str, n_ctx: int | None = None, ctx_why: str = "") -> Served:
        async with self._locked():  # one load at a time, as Ollama's scheduler; no unload beside it
            current = self.loaded.get(key)
            if _answers(current, digest, n_ctx):
                return current  # loaded by another request while this one waited for the lock
            larger = current is not None and not current.closed and current.manifest_digest == digest
            if self.before_load is not None and not larger:  # before the plan: the devices are measured there
                await self.before_load(key)
            try:
                pair = await self._plan(key, n_ctx if larger else None, ctx_why or REQUEST_CHOSE)
            except ServerFault as exc:
                if not larger:
                    raise
                log.warning("%s: num_ctx %d does not fit (%s): it keeps context %d", key, n_ctx, exc, current.n_ctx)
                current.refused_ctx = max(current.refused_ctx, n_ctx)
                return current
            if current is not None:
                why = (
                    f"context {n_ctx} for {ctx_why or REQUEST_CHOSE}, beyond its {current.n_ctx}"
                    if larger
                    else "its manifest changed"
                )
                await self._unload(current, why)
            pair = await self._make_room(pair)
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
                manifest_digest=digest,
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
        engine = Engine(pair.target, pair.draft, pair.engine, notice=log.info, fit=pair.fit)
        try:
            engine.costs.online = True  # -k auto learns its costs from the first passes: no timing at load
        except BaseException:
            engine.close()
            raise
        return engine

    async def _plan(self, key: str, n_ctx: int | None = None, ctx_why: str = "") -> PairPlan:
        """The pair and its context (`n_ctx`, chosen by `ctx_why`), planned against the whole of the
        (budgeted) machine: what cannot fit even alone is refused here, before anything is unloaded for it."""
        try:
            devices, notes = await asyncio.to_thread(self._machine)
            pair = await asyncio.to_thread(self.pairs.plan, key, devices, notes, n_ctx, ctx_why)
        except ModelNotFound as exc:
            raise ModelNotFound(one_line(str(exc))) from None
        except OllamaSpecError as exc:
            raise _refusal(exc) from None
        return replace(pair, settings=replace(pair.settings, max_queue=self.max_queue))

    async def _make_room(self, pair: PairPlan) -> PairPlan:
        """Unload idle models, least recently used first, until `pair` fits beside the rest; wait for busy
        ones (and retiring ones) to become idle and close (up to load_timeout). Runs under the lock. The
        pair with its fit beside what stays loaded: what the engine loads with."""
        deadline = time.monotonic() + self.settings.load_timeout
        while (fitted := self._room_for(pair)) is None:
            await self._close_retired()
            idle = [s for s in self.loaded.values() if s.idle and not self._wanted[s.name]]
            if idle:
                victim = min(idle, key=lambda s: s.last_used)
                await self._unload(victim, f"to make room for {pair.name}")
                continue
            if (fitted := self._room_for(pair)) is not None:
                break
            if time.monotonic() > deadline:
                raise Busy(f"{pair.name} cannot load: the loaded models stayed busy; retry later", RETRY_AFTER_BUSY)
            await asyncio.sleep(WAIT_SECONDS)
        return fitted

    def _taking(self) -> list[Served]:
        """Every pair in memory: the loaded ones and those retiring."""
        return [*self.loaded.values(), *self.unloading]

    def _room_for(self, pair: PairPlan) -> PairPlan | None:
        """`pair` with its fit on the memory the loaded pairs leave (its context and slots as planned for
        the whole machine), or None while it does not fit beside them."""
        taking = self._taking()
        if len(taking) >= self._max_loaded():
            return None
        if pair.plan is None or not taking:
            return pair
        devices, notes = self._machine()
        taken = (sum(s.memory[0] for s in taking), sum(s.memory[1] for s in taking))
        fixed = ContextChoice(pair.engine.n_ctx, False, pair.ctx_why)
        try:
            fit = fit_pair(
                pair_facts(pair.target, pair.draft, pair.engine), fixed, [pair.fit.slots], devices, notes, taken
            )
        except InsufficientMemory:
            return None
        return replace(pair, plan=fit.plan)

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

    async def _unload(self, served: Served, why: str) -> None:
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

    async def _close_retired(self) -> None:
        """Close the retiring pairs whose last request has ended. Under the lock."""
        for served in [s for s in self.unloading if s.idle]:
            self.unloading.remove(served)
            log.info("unloading %s: its last request ended", served.name)
            await self._close(served)

    @staticmethod
    async def _close(served: Served) -> None:
        served.closed = True  # at once, on the loop: a request resuming meanwhile looks for another pair
        await asyncio.to_thread(served.close)

    # --- expiry ----------------------------------------------------------------------------------

    def _start_reaper(self) -> None:
        if self._reaper is None or self._reaper.done():
            self._reaper = asyncio.ensure_future(self._reap())

    async def _reap(self) -> None:
        """Unload the idle models whose keep_alive has run out, and close retiring ones left idle."""
        while True:
            await asyncio.sleep(REAP_SECONDS)
            if not self._expired() and not any(s.idle for s in self.unloading):
                continue
            async with self._locked():
                await self._close_retired()
                for served in self._expired():
                    await self._unload(served, "its keep_alive ran out")

    def _expired(self) -> list[Served]:
        now = time.time()
        return [s for s in self.loaded.values() if s.idle and not self._wanted[s.name] and s.expires_at <= now]


def _answers(served: Served | None, digest: str, n_ctx: int | None) -> bool:
    """Whether a loaded pair can answer a request for its model's manifest `digest` with context `n_ctx`:
    open, the same manifest, and a context as large (or as large as its trained length, or as large as
    fits: a larger one was refused)."""
    if served is None or served.closed or served.manifest_digest != digest:
        return False
    return n_ctx is None or n_ctx <= max(served.n_ctx, served.refused_ctx) or served.n_ctx >= served.trained_ctx


def _loads(served: Served, name: str) -> bool:
    """Whether `served` has the stored `name` loaded, as its target or its draft."""
    draft = served.engine.draft_model
    return name in (served.name, draft.name if draft is not None else None)


def _refusal(exc: OllamaSpecError) -> OllamaSpecError:
    """A model that cannot run as Ollama answers it: too big for this machine is the server's fault (500) in
    the memory plan's words; anything else about the model (not usable, a draft that does not fit it) a 400."""
    kind = ServerFault if isinstance(exc, InsufficientMemory) else InvalidRequest
    return kind(one_line(str(exc)))
