"""The server's state: the pairs it serves (one pinned pair, or the store's models loaded on demand by the
scheduler), the settings and the metrics. Routes ask `await state.acquire(name, keep_alive)` for the
pair that answers a name, and use what it gives them (core/loaded.py)."""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from ollama_spec.engine.engine import Engine, Request
from ollama_spec.errors import InvalidSetting
from ollama_spec.server.core.errors import ApiError
from ollama_spec.server.core.keep_alive import parse_keep_alive
from ollama_spec.server.core.loaded import Served
from ollama_spec.server.core.pinned import PinnedPair
from ollama_spec.server.core.request import Asked
from ollama_spec.server.core.settings import ServerSettings
from ollama_spec.server.metrics import Metrics

if TYPE_CHECKING:
    from ollama_spec.models.resolve import ResolvedModel
    from ollama_spec.server.scheduler import Scheduler
    from ollama_spec.server.upstream import Upstream

T = TypeVar("T")
# The pairs the current HTTP request holds: set by the Leases middleware, released when its answer ends.
HELD: contextvars.ContextVar[list[Served] | None] = contextvars.ContextVar("held", default=None)
# The seconds the current HTTP request waited for its model to load (Ollama's load_duration), per acquire.
WAITED: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("waited", default=None)


def load_waited() -> float:
    """Seconds the current request waited for loads: 0 when its model was loaded already."""
    return sum(WAITED.get() or ())


class ServerState:
    """What the routes share. With an `engine`: that pair, pinned, answers every model name (serve
    TARGET). Without: `scheduler` loads the store's models as they are asked for (serve). Either is
    `serving` (core/pinned.PinnedPair or server/scheduler.Scheduler: one interface), and this state never
    asks which. `upstream`: the Ollama daemon this server stands in front of (serve --upstream), or None."""

    def __init__(
        self,
        engine: Engine | None,
        settings: ServerSettings,
        scheduler: Scheduler | None = None,
        upstream: Upstream | None = None,
    ):
        assert (engine is None) != (scheduler is None), "a pinned engine or a scheduler"
        self.settings = settings
        self.started = time.time()
        self.metrics = Metrics(lambda: self.waiting)
        if engine is not None:
            self.serving: PinnedPair | Scheduler = PinnedPair(Served(engine, settings, self.metrics, pinned=True))
        else:
            self.serving = scheduler
            scheduler.metrics = self.metrics
        self._upstream: Upstream | None = None
        self.upstream = upstream
        # the store root as resolve_model takes it (None: $OLLAMA_MODELS, then the defaults)
        self.models_dir: str | None = scheduler.pairs.models_dir if scheduler is not None else None

    @property
    def upstream(self) -> Upstream | None:
        return self._upstream

    @upstream.setter
    def upstream(self, upstream: Upstream | None) -> None:
        self._upstream = upstream
        # the daemon lets go of a model before it loads here
        self.serving.before_load = upstream.unload_if_loaded if upstream is not None else None

    # --- what every route asks ------------------------------------------------------------------------

    async def acquire(self, name: str, keep_alive: float | str | None = None, n_ctx: int | None = None) -> Served:
        """The pair that answers `name`, loaded first if need be (the first request waits for the load;
        others for the same model share it), again with a larger context when `n_ctx` (a request's
        num_ctx) asks for more than the loaded one and the memory plan allows it. Held until the HTTP
        answer ends, streams included; the time it waited counts as the request's load_duration."""
        try:
            seconds = None if keep_alive is None else parse_keep_alive(keep_alive)
        except InvalidSetting as exc:
            raise ApiError(400, str(exc), "keep_alive") from None
        started = time.monotonic()
        served = await self.serving.acquire(name, seconds, n_ctx)
        if served.loaded_at >= started and (waited := WAITED.get()) is not None:  # it loaded for this request
            waited.append(time.monotonic() - started)
        held = HELD.get()
        if held is not None:
            held.append(served)
        else:  # no middleware (a direct call): the keep_alive counts from now
            await self.serving.release(served)
        return served

    async def prepare(
        self, name: str, keep_alive: float | str | None, n_ctx: int | None, ask: Callable[[Served], Asked]
    ) -> tuple[Served, Request]:
        """The pair for `name` (with at least `n_ctx`, a request's num_ctx, as `acquire` gives it) and what
        `ask(pair)` asks, as its checked Request. A prompt that had to be fitted into the loaded context
        loads the model again with the context that holds it whole (up to the trained length) where the
        memory plan allows it, as a larger num_ctx would; else it stays fitted, with its warning."""
        served = await self.acquire(name, keep_alive, n_ctx)
        request = await served.prepare(ask(served))
        if request.context_wanted <= served.n_ctx:
            return served, request
        await self._let_go(served)  # its room may be what the larger one needs
        larger = await self.acquire(name, keep_alive, request.context_wanted)
        return larger, request if larger is served else await larger.prepare(ask(larger))

    async def _let_go(self, served: Served) -> None:
        """Release `served` before the answer ends (the request goes on with another pair)."""
        held = HELD.get()
        if held is not None and served in held:
            held.remove(served)
            await self.serving.release(served)

    async def release_all(self, held: list[Served]) -> None:
        """The answer that held these ended."""
        for served in held:
            await self.serving.release(served)

    async def canonical(self, name: str) -> str:
        """The stored name for `name` (a pinned pair takes any name as asked): a 404 as Ollama's when there is none."""
        return await self.serving.canonical(name)

    def loaded(self) -> list[Served]:
        """The pairs loaded now, that requests may take."""
        return list(self.serving.loaded.values())

    def in_memory(self) -> list[Served]:
        """The pairs that take memory now: the loaded ones, then those unloading once their requests end."""
        return [*self.loaded(), *self.serving.unloading]

    async def serves(self, name: str) -> bool:
        """Whether this server answers `name` itself: a pinned pair answers every name; the store, the
        models it can run (the others go to the upstream daemon, when there is one)."""
        return await asyncio.to_thread(self.serving.can_run, name)

    def listed(self) -> list[tuple[str, ResolvedModel]]:
        """The names clients may ask for and their models, as /api/tags and /v1/models list them (blocks)."""
        return self.serving.listed()

    async def describe(self, name: str) -> tuple[Served | None, ResolvedModel, str | None, str]:
        """What /api/show says of `name`: its loaded pair (None: not loaded), its model, draft and why."""
        return await self.serving.describe(name)

    @property
    def waiting(self) -> int:
        return sum(served.worker.waiting for served in self.in_memory())

    # --- hooks for the store's writers (the management routes) ---------------------------------------

    async def store_changed(self) -> None:
        """The store was written (a pull, a delete, a copy): list its models afresh; a loaded model whose
        manifest changed is loaded again for the next request."""
        await self.serving.store_changed()

    async def unload(self, name: str) -> bool:
        """Unload `name` if it is loaded (once its running requests end); False if it was not. A pinned
        pair stays: False."""
        return await self.serving.unload(name)

    async def delete(self, name: str, remove: Callable[[str], T]) -> T:
        """`remove(stored name)` on a thread, once no loaded pair uses the model (the scheduler's delete)."""
        return await self.serving.delete(name, remove)

    # --- shutdown --------------------------------------------------------------------------------------

    def cancel_all(self) -> None:
        """Stop every generation (a signal: the streams end now)."""
        for served in self.in_memory():
            served.worker.cancel_all()

    def close(self) -> None:
        """Stop the workers and unload what the scheduler loaded (a pinned engine is its owner's to close)."""
        self.serving.shutdown()
