"""`serve TARGET`: one pair, pinned, answers every model name and is never unloaded. The same interface as
the store's scheduler (serving/scheduler.py), so that the server's state never asks which one it holds."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from ollama_spec.server.serving.loaded import Served

if TYPE_CHECKING:
    from ollama_spec.models.resolve import ResolvedModel

T = TypeVar("T")


class PinnedPair:
    """The one pair of `serve TARGET`: what it answers, holds and lists."""

    answers_every_name = True  # no request goes to an upstream daemon for a model name

    def __init__(self, served: Served):
        self.served = served
        self.before_load: Callable[[str], Awaitable[object]] | None = None  # nothing loads after the start

    @property
    def loaded(self) -> dict[str, Served]:
        return {self.served.name: self.served}

    async def canonical(self, name: str) -> str:
        """Any name is this pair's, as asked."""
        return name

    async def describe(self, name: str) -> tuple[Served | None, ResolvedModel, str | None, str]:
        """What /api/show says of any name: this pair, its draft and why."""
        served = self.served
        return served, served.engine.target_model, served.proposer_name, served.draft_why

    async def acquire(self, name: str, keep_alive: float | None, n_ctx: int | None = None, ctx_why: str = "") -> Served:
        """The pair, whatever the name; its context is the one it was started with."""
        return self.served

    async def release(self, served: Served) -> None:
        """Nothing counts down: the pair stays."""

    async def unload(self, name: str) -> bool:
        """Never unloaded: False."""
        return False

    async def store_changed(self) -> None:
        """The pair was loaded from files before the store changed: it keeps them."""

    async def delete(self, name: str, remove: Callable[[str], T]) -> T:
        """`remove(name)` on a thread: the pinned pair keeps the files it loaded open."""
        return await asyncio.to_thread(remove, name)

    def can_run(self, name: str) -> bool:
        return True

    def has_model(self, name: str) -> bool:
        return True

    def listed(self) -> list[tuple[str, ResolvedModel]]:
        """Its names (--served-model-name, else the model's), each the one model."""
        return [(name, self.served.engine.target_model) for name in self.served.model_names]

    def health(self) -> dict:
        return {"model": self.served.model_name}

    @property
    def unloading(self) -> list[Served]:
        """Never unloaded: none."""
        return []

    def __str__(self) -> str:
        slots = self.served.worker.slots
        flash = self.served.engine.flash_choice
        return f"{self.served.model_name}, {slots} slot{'' if slots == 1 else 's'}, flash attention {flash},"

    def shutdown(self) -> None:
        """Stop its worker (the engine is its owner's to close)."""
        self.served.close()
