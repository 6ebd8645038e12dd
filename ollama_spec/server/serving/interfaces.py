"""What the server's state asks of the pieces it is handed, as protocols: the pairs it serves (a pinned pair,
serving/pinned.PinnedPair, or the store's models loaded on demand, serving/scheduler.Scheduler) and the Ollama
daemon it stands in front of (http/upstream.Upstream). The state names no module above serving/."""

from __future__ import annotations

from collections.abc import AsyncIterable, Awaitable, Callable
from typing import TYPE_CHECKING, Protocol, TypeVar

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from ollama_spec.models.resolve import ResolvedModel
    from ollama_spec.server.serving.loaded import Served
    from ollama_spec.server.serving.metrics import Metrics

T = TypeVar("T")


class Serving(Protocol):
    """The pairs that answer the routes' model names, loaded (and unloaded) as the implementation decides."""

    answers_every_name: bool  # a pinned pair answers every name: none goes to the upstream daemon
    before_load: Callable[[str], Awaitable[object]] | None  # awaited with a model's name before it loads

    @property
    def loaded(self) -> dict[str, Served]: ...
    async def canonical(self, name: str) -> str: ...
    async def describe(self, name: str) -> tuple[Served | None, ResolvedModel, str | None, str]: ...
    async def acquire(
        self, name: str, keep_alive: float | None, n_ctx: int | None = None, ctx_why: str = ""
    ) -> Served: ...
    async def release(self, served: Served) -> None: ...
    async def unload(self, name: str) -> bool: ...
    async def store_changed(self) -> None: ...
    async def delete(self, name: str, remove: Callable[[str], T]) -> T: ...
    def can_run(self, name: str) -> bool: ...
    def listed(self) -> list[tuple[str, ResolvedModel]]: ...
    def health(self) -> dict: ...
    def shutdown(self) -> None: ...


class Store(Protocol):
    models_dir: str | None  # the store root as resolve_model takes it (None: $OLLAMA_MODELS, then the defaults)


class OnDemand(Serving, Protocol):
    """The store's models, loaded as they are asked for; it counts into the state's metrics."""

    metrics: Metrics
    pairs: Store


class Upstream(Protocol):
    """The Ollama daemon this server stands in front of (serve --upstream)."""

    async def tags(self) -> list[dict]: ...
    async def forward(self, http_request: Request, body: bytes | AsyncIterable[bytes]) -> Response: ...
    async def unload_if_loaded(self, name: str) -> bool: ...
