"""The server's state: the pairs it serves (one pinned pair, or the store's models loaded on demand by the
scheduler), the settings and the metrics. Routes ask `await state.acquire(name, keep_alive)` for the
pair that answers a name, and use what it gives them (serving/loaded.py)."""

from __future__ import annotations

import asyncio
import contextvars
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, TypeVar

from ollama_spec.engine.engine import Engine, Request, Result
from ollama_spec.errors import InvalidRequest, InvalidSetting, PromptTooLong
from ollama_spec.server.serving.fitting import reload_size
from ollama_spec.server.serving.interfaces import OnDemand, Serving, Upstream
from ollama_spec.server.serving.keep_alive import parse_keep_alive
from ollama_spec.server.serving.loaded import Served
from ollama_spec.server.serving.metrics import Metrics
from ollama_spec.server.serving.pinned import PinnedPair
from ollama_spec.server.serving.request import Asked, Grammars, check_asked
from ollama_spec.server.serving.settings import ServerSettings

if TYPE_CHECKING:
    from ollama_spec.models.resolve import ResolvedModel

T = TypeVar("T")
# what a route lays over its Asked once the pair is there (a thinking model's switch, a template's tokens)
Fitting = Callable[[Served, Asked], Asked] | None
log = logging.getLogger("ollama_spec.server")
# The pairs the current HTTP request holds: set by the Leases middleware, released when its answer ends.
HELD: contextvars.ContextVar[list[Served] | None] = contextvars.ContextVar("held", default=None)


@dataclass
class Clock:
    """When the current HTTP request arrived and when it last got its model: Ollama's checkpointStart and
    checkpointLoaded, from which its durations count."""

    arrived: float = field(default_factory=time.monotonic)
    acquired: float | None = None


@dataclass(frozen=True)
class Durations:
    """A request's seconds as Ollama reports them: `total` from its arrival; `load` until it had its model
    (a load it waited for, a larger context); `prompt` from then to its first token (the queue for a slot,
    the prompt's rendering and reading); `eval` the rest of the generation."""

    total: float
    load: float = 0.0
    prompt: float = 0.0
    eval: float = 0.0


# The current HTTP request's clock: set by the Leases middleware.
CLOCK: contextvars.ContextVar[Clock | None] = contextvars.ContextVar("clock", default=None)


def durations(result: Result | None = None) -> Durations:
    """The current request's durations up to now, `result` its generation (None: work without one, such
    as an embedding). Outside an HTTP request, the generation's own."""
    generating = (result.total_seconds - result.first_token_seconds) if result is not None else 0.0
    clock = CLOCK.get()
    if clock is None:
        first = result.first_token_seconds if result is not None else 0.0
        return Durations(first + generating, 0.0, first, generating)
    total = time.monotonic() - clock.arrived
    load = (clock.acquired or clock.arrived) - clock.arrived
    generating = min(generating, total - load)
    return Durations(total, load, total - load - generating, generating)


class ServerState:
    """What the routes share. With an `engine`: that pair, pinned, answers every model name (serve
    TARGET). Without: `scheduler` loads the store's models as they are asked for (serve). Either is
    `serving` (serving/pinned.PinnedPair or serving/scheduler.Scheduler: one interface), and this state never
    asks which. `upstream`: the Ollama daemon this server stands in front of (serve --upstream), or None."""

    def __init__(
        self,
        engine: Engine | None,
        settings: ServerSettings,
        scheduler: OnDemand | None = None,
        upstream: Upstream | None = None,
    ):
        assert (engine is None) != (scheduler is None), "a pinned engine or a scheduler"
        self.settings = settings
        self.started = time.time()
        self.metrics = Metrics(lambda: self.waiting)
        if engine is not None:
            self.serving: Serving = PinnedPair(Served(engine, settings, self.metrics, pinned=True))
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

    async def acquire(
        self, name: str, keep_alive: float | str | None = None, n_ctx: int | None = None, ctx_why: str = ""
    ) -> Served:
        """The pair that answers `name`, loaded first if need be (the first request waits for the load;
        others for the same model share it), again with a larger context when `n_ctx` (a request's
        num_ctx, or what `ctx_why` says chose it) asks for more than the loaded one and the memory plan
        allows it. Held until the HTTP answer ends, streams included; the time from the request's
        arrival to here is its load_duration."""
        try:
            seconds = None if keep_alive is None else parse_keep_alive(keep_alive)
        except InvalidSetting as exc:
            raise InvalidRequest(str(exc), "keep_alive") from None
        served = await self.serving.acquire(name, seconds, n_ctx, ctx_why)
        if (clock := CLOCK.get()) is not None:
            clock.acquired = time.monotonic()
        held = HELD.get()
        if held is not None:
            held.append(served)
        else:  # no middleware (a direct call): the keep_alive counts from now
            await self.serving.release(served)
        return served

    async def prepare(
        self, name: str, keep_alive: float | str | None, n_ctx: int | None, asked: Asked, fit: Fitting = None
    ) -> tuple[Served, Request]:
        """The pair for `name` and `asked` as its checked Request: `prepare_each` with one."""
        served, (request,) = await self.prepare_each(name, keep_alive, n_ctx, [asked], fit)
        return served, request

    async def prepare_each(
        self, name: str, keep_alive: float | str | None, n_ctx: int | None, asked: Sequence[Asked], fit: Fitting = None
    ) -> tuple[Served, list[Request]]:
        """The one path of every generating route to its pair: each of `asked` checked as far as it can be
        without the model (check_asked) before anything loads; then the pair for `name` (with at least `n_ctx`,
        a request's num_ctx, as `acquire` gives it) and each of `asked`, laid over the pair by `fit` (what
        needs the model: a thinking model's switch, a template's tokens), as its checked Request. A prompt
        that had to be fitted into the loaded context (and asked no num_ctx), or that is refused as too long
        (PromptTooLong: OpenAI's routes), loads the model again with a context that holds it whole
        (fitting.reload_size, up to the trained length) where the memory plan allows it, as a larger num_ctx
        would; else it stays fitted, or is refused. The warnings of the requests as they run are logged, once."""
        for one in asked:
            check_asked(one)
        served = await self.acquire(name, keep_alive, n_ctx)
        grammars: Grammars = {}  # compiled once for every prompt, and for the pair reloaded larger
        requests, wanted, refused = await _built(served, asked, fit, grammars)
        if wanted > served.n_ctx and not n_ctx:  # a request's num_ctx is the client's say
            await self._let_go(served)  # its room may be what the larger one needs
            size = reload_size(served.n_ctx, wanted, served.trained_ctx)
            larger = await self.acquire(name, keep_alive, size, f"a prompt that needs {wanted}")
            if larger is not served:
                served, (requests, _, refused) = larger, await _built(larger, asked, fit, grammars)
        if refused is not None:
            raise refused
        for warning in [warning for request in requests for warning in request.warnings]:  # once, as it runs
            log.warning("%s: %s", served.name, warning)
        return served, requests

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


async def _built(
    served: Served, asked: Sequence[Asked], fit: Fitting, grammars: Grammars
) -> tuple[list[Request], int, PromptTooLong | None]:
    """Each of `asked` as a checked Request for `served` (their grammars compiled once, in `grammars`), the
    largest context one of them would want, and the first refused as too long (then the list is short)."""
    requests, wanted, refused = [], 0, None
    for one in asked:
        try:
            request = await served.prepare(fit(served, one) if fit else one, grammars)
        except PromptTooLong as exc:  # a route that does not fit prompts (OpenAI's): a larger context may hold it
            wanted, refused = max(wanted, exc.wanted), refused or exc
            continue
        requests.append(request)
        wanted = max(wanted, request.context_wanted)
    return requests, wanted, refused
