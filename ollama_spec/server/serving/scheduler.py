"""Models loaded on demand, as Ollama's scheduler loads them (server/sched.go): the first request for a
model waits for its load (others for the same model share it), each stays for its keep_alive after
its last request, at most max_loaded at once, and when a new one does not fit beside the loaded ones
the idle ones are unloaded first, least recently used. A model that cannot fit at all is refused
with the memory plan's words."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import TypeVar
from weakref import WeakKeyDictionary

from ollama_spec.engine.engine import Engine
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
from ollama_spec.models.resolve import ResolvedModel
from ollama_spec.models.store import StoredModel
from ollama_spec.server.serving.loaded import Served
from ollama_spec.server.serving.metrics import Metrics
from ollama_spec.server.serving.pairs import PairPlan, StorePairs
from ollama_spec.server.serving.resident import Resident
from ollama_spec.server.serving.room import RETRY_AFTER_BUSY, Room, SchedulerSettings
from ollama_spec.server.serving.store_reads import forget, read_once
from ollama_spec.server.serving.worker import ModelDeleted

__all__ = ["Scheduler", "SchedulerSettings"]
log = logging.getLogger("ollama_spec.server")
REQUEST_CHOSE = "a request's num_ctx"  # who chose a larger context, unless the caller says
DELETE_WAIT_SECONDS = 30.0  # how long a delete waits for its model's cut-short requests to end
T = TypeVar("T")


def not_found(name: str) -> ModelNotFound:
    return ModelNotFound(f'model "{name}" not found, try pulling it first')  # Ollama's words


class Scheduler:
    """The loaded pairs by stored name, and the one owner of loading, evicting, unloading and deleting them.

    All four run under one lock (resident.py), so no load sees room that a closing pair still takes. A pair
    leaves `loaded` when it is evicted, expires, is asked to unload, is deleted or its manifest changes (a
    copy or a pull over its name); while requests still use it, it waits in `unloading`, still counted as
    taking its memory, and closes when the last of them ends (a delete ends them at their next step). A
    request's name is read from the store once: the model read is what is planned and loaded."""

    answers_every_name = False  # a name the store cannot run goes to the upstream daemon, when there is one

    def __init__(self, pairs: StorePairs, settings: SchedulerSettings, metrics: Metrics, max_queue: int):
        self.pairs, self.settings, self.metrics, self.max_queue = pairs, settings, metrics, max_queue
        self.resident = Resident()
        self.room = Room(settings, self.resident)
        self.loaded, self.unloading = self.resident.loaded, self.resident.unloading  # the same objects
        self._loading: dict[str, asyncio.Future[Served]] = {}
        self._deleting: set[str] = set()  # stored names a delete is removing: requests for them are 404s
        # what each loaded pair was decided as (pairs.decide): a reload for a larger context fits it again
        self._decided: WeakKeyDictionary[Served, PairPlan] = WeakKeyDictionary()
        # called with a model's stored name before it loads: serve --upstream asks the daemon to let go of it
        self.before_load: Callable[[str], Awaitable[object]] | None = None

    async def canonical(self, name: str) -> str:
        """The stored name for a requested one: 404 as Ollama answers when the store has none."""
        return (await self._identify(name)).name

    def can_run(self, name: str) -> bool:
        """Whether `name` is a model of the store that can run here (blocks: run it on a thread)."""
        try:
            stored = read_once(name, self.pairs.identify)
        except OllamaSpecError:
            return False
        return self.pairs.can_run(stored)

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
        stored = await self._identify(name)
        key = stored.name
        served = self.loaded.get(key)
        if served is not None:
            return served, served.engine.target_model, served.proposer_name, served.draft_why
        try:
            model, draft, why = await asyncio.to_thread(self.pairs.describe, stored)
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

    async def _identify(self, name: str) -> StoredModel:
        """The stored model for `name`: its stored name and its manifest's digest, in one read of the store."""
        try:
            stored = await asyncio.to_thread(read_once, name, self.pairs.identify)
        except (ModelNotFound, InvalidModelName):
            raise not_found(name) from None
        except OllamaSpecError as exc:
            raise ServerFault(one_line(str(exc))) from None
        if stored.name in self._deleting:
            raise not_found(name)
        return stored

    async def acquire(self, name: str, keep_alive: float | None, n_ctx: int | None = None, ctx_why: str = "") -> Served:
        """The loaded pair for `name`, loaded now if need be: again if its manifest changed since, or with a
        larger context when `n_ctx` asks for more than it has (and the memory plan allows it). `ctx_why`:
        who chose `n_ctx` (default: a request's num_ctx), for the log. The caller holds it (`users`) until
        `release`."""
        self.resident.start_expiry()
        wanted = self.resident.wanted
        while True:  # again if a delete closed the pair between its load and this request's turn
            stored = await self._identify(name)
            key = stored.name
            wanted[key] += 1
            try:
                served = self.loaded.get(key)
                if not _answers(served, stored.digest, n_ctx):
                    future = self._loading.get(key)
                    if future is None:
                        future = self._loading[key] = asyncio.ensure_future(
                            self._load(stored, n_ctx, ctx_why, keep_alive)
                        )
                        future.add_done_callback(lambda _, key=key: self._loading.pop(key, None))
                    served = await asyncio.shield(future)
            finally:
                wanted[key] -= 1
                self.resident.changed.notify()  # a pair no longer wanted may be evicted or expire
            if not served.closed:
                break
            forget(name)  # a delete closed it: is the model still there?
        served.users += 1
        served.keep_alive = self.settings.keep_alive if keep_alive is None else keep_alive
        served.touch()
        return served

    async def release(self, served: Served) -> None:
        """A request that held `served` ended: its keep_alive counts from now (0: unloaded at once); a
        retiring pair closes with its last request."""
        served.users -= 1
        served.touch()
        await self.resident.settle(served)

    async def unload(self, name: str) -> bool:
        """Unload `name` if it is loaded: now if idle, else when its running requests end (as Ollama's
        keep_alive 0); False if it was not loaded."""
        try:
            key = await asyncio.to_thread(self.pairs.canonical, name)
        except OllamaSpecError:
            key = name
        async with self.resident.locked():
            served = self.loaded.get(key)
            if served is None:
                return False
            await self.resident.unload(served, "asked to")
        return True

    async def store_changed(self) -> None:
        """The store was written here (a pull, a copy, a delete): list its models afresh, and retire the
        loaded pairs whose manifest changed, so that the next request, and /api/show, see the new model."""
        self.pairs.changed()
        async with self.resident.locked():
            for served in list(self.loaded.values()):
                try:
                    digest = (await asyncio.to_thread(self.pairs.identify, served.name)).digest
                except OllamaSpecError:
                    digest = None
                if digest != served.manifest_digest:
                    await self.resident.unload(served, "its manifest changed" if digest else "it left the store")

    async def delete(self, name: str, remove: Callable[[str], T]) -> T:
        """Delete the stored `name` with `remove(stored name)` (on a thread), once the pairs that load it (as
        target or draft) have closed: their running requests end at their next step, as Ollama's delete ends
        them (their clients get a 404; the delete a 503, nothing deleted, if they have not ended within
        DELETE_WAIT_SECONDS). A load in progress finishes first; requests for the name meanwhile are 404s,
        as after the delete."""
        key = await self.canonical(name)
        self._deleting.add(key)
        resident = self.resident
        try:
            async with resident.locked():
                for served in [s for s in self.loaded.values() if _loads(s, key)]:
                    await resident.unload(served, "its model is being deleted")
            deadline = time.monotonic() + DELETE_WAIT_SECONDS
            while busy := [served for served in self.unloading if _loads(served, key) and not served.closed]:
                for served in busy:
                    served.worker.cancel_all(f'model "{name}" is being deleted', ModelDeleted)
                if (left := deadline - time.monotonic()) <= 0:
                    raise Busy(
                        f'model "{name}" is still in use: its requests did not end; retry later', RETRY_AFTER_BUSY
                    )
                await resident.changed.wait(left)  # until one of them closes
            async with resident.locked():
                return await asyncio.to_thread(remove, key)
        finally:
            self._deleting.discard(key)
            self.pairs.changed()

    def shutdown(self) -> None:
        """Unload everything now, from outside the event loop (the server has stopped)."""
        self.resident.stop()
        for served in self.resident.taking():
            served.close()
        self.loaded.clear()
        self.unloading.clear()

    async def _load(
        self, stored: StoredModel, n_ctx: int | None = None, ctx_why: str = "", keep_alive: float | None = None
    ) -> Served:
        """Load the model `_identify` read, planned once (pairs.decide, pairs.fit) and loaded as planned
        (Engine.load). Again with a larger context: the loaded pair's decisions stand, only the fit is new.
        It starts with the loading request's keep_alive (what /api/ps lists before that request's turn)."""
        key, digest = stored.name, stored.digest
        async with self.resident.locked():  # one load at a time, as Ollama's scheduler; no unload beside it
            current = self.loaded.get(key)
            if _answers(current, digest, n_ctx):
                return current  # loaded by another request while this one waited for the lock
            larger = current is not None and not current.closed and current.manifest_digest == digest
            if self.before_load is not None and not larger:  # before the plan: the devices are measured there
                await self.before_load(key)
            decided = self._decided.get(current) if larger else None
            try:
                decided, pair = await self._plan(stored, n_ctx if larger else None, ctx_why or REQUEST_CHOSE, decided)
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
                await self.resident.unload(current, why)
            pair = await self.room.make(pair)
            started = time.monotonic()
            try:
                engine = await asyncio.to_thread(_open, pair)
            except OllamaSpecError as exc:
                raise _refusal(exc) from None
            served = Served(
                engine,
                pair.settings,
                self.metrics,
                name=pair.name,
                draft_why=pair.draft_why,
                keep_alive=self.settings.keep_alive if keep_alive is None else keep_alive,
                memory=(pair.plan.gpu_bytes, pair.plan.host_bytes) if pair.plan else (0, 0),
                manifest_digest=digest,
            )
            served.touch()
            self.resident.watch(served)
            self.loaded[key], self._decided[served] = served, decided
            log.info(
                "loaded %s in %.1f s: context %d (%s), %d slot%s, draft: %s, flash attention %s",
                key,
                time.monotonic() - started,
                engine.target.n_ctx,
                pair.ctx_why,
                engine.slots,
                "" if engine.slots == 1 else "s",
                served.draft_why,
                engine.flash_choice,
            )
            return served

    async def _plan(
        self, stored: StoredModel, n_ctx: int | None = None, ctx_why: str = "", decided: PairPlan | None = None
    ) -> tuple[PairPlan, PairPlan]:
        """The pair as decided (`decided`, else decided now: pairs.decide) and fitted with its context (`n_ctx`,
        chosen by `ctx_why`) against the whole of the (budgeted) machine: what cannot run, or fit even alone,
        is refused here, before anything is unloaded for it."""
        try:
            devices, notes = await asyncio.to_thread(self.room.machine)
            decided = decided or await asyncio.to_thread(self.pairs.decide, stored)
            pair = await asyncio.to_thread(self.pairs.fit, decided, devices, notes, n_ctx, ctx_why)
        except ModelNotFound as exc:
            raise ModelNotFound(one_line(str(exc))) from None
        except OllamaSpecError as exc:
            # the name was read before a delete took its files (a request retrying after the delete closed
            # its pair): not found, as after the delete; files missing from a model still named are a 400
            if not await asyncio.to_thread(self.has_model, stored.name):
                raise not_found(stored.name) from None
            raise _refusal(exc) from None
        return decided, replace(pair, settings=replace(pair.settings, max_queue=self.max_queue))


def _open(pair: PairPlan) -> Engine:
    """The engine for `pair`, loaded as planned."""
    engine = Engine.load(pair.load, notice=log.info)
    try:
        engine.costs.online = True  # -k auto learns its costs from the first passes: no timing at load
    except BaseException:
        engine.close()
        raise
    return engine


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
