"""One loaded pair as the routes use it: its engine, the worker that runs it, its request defaults, which
draft it has and why, and how long it stays loaded (the scheduler's bookkeeping)."""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ollama_spec.engine.engine import Engine, Request, Result
from ollama_spec.server.serving import speculation
from ollama_spec.server.serving.keep_alive import FOREVER
from ollama_spec.server.serving.metrics import Metrics
from ollama_spec.server.serving.request import Asked, Grammars, build_request
from ollama_spec.server.serving.settings import ServerSettings
from ollama_spec.server.serving.worker import Job, QueueFull, Worker

log = logging.getLogger("ollama_spec.server")
T = TypeVar("T")


@dataclass(eq=False)
class Served:
    """A loaded target (and draft) with its worker. `name`: the model's name in the store (or the name
    responses report, for a pinned pair); `draft_why`: which draft it got and why, as /api/ps says it."""

    engine: Engine
    settings: ServerSettings
    metrics: Metrics
    name: str = ""
    draft_why: str = ""
    pinned: bool = False  # serve TARGET: answers every name, never unloaded
    keep_alive: float = FOREVER
    memory: tuple[int, int] = (0, 0)  # what the memory plan counted: bytes on GPUs, bytes in RAM
    manifest_digest: str = ""  # sha256 of the target's manifest when it loaded: another one means reload
    refused_ctx: int = 0  # the largest num_ctx a request asked for that the memory plan refused
    worker: Worker = field(init=False)
    users: int = 0  # requests between their acquire and their end (streams included)
    last_used: float = field(default_factory=time.monotonic)
    loaded_at: float = field(default_factory=time.monotonic)  # made once its engine had loaded
    expires_at: float = math.inf  # time.time() when it is unloaded if still idle; inf: never
    closed: bool = False  # no request may take it any more (it is being freed, or is)
    unloading_since: float = 0.0  # time.time() when it was set to unload once its running requests end
    _freed: bool = field(default=False, init=False, repr=False)

    def __post_init__(self) -> None:
        self.worker = Worker(self.engine, self.settings.max_queue, self._finished)
        self.name = self.name or self.engine.target_model.name
        self.draft_why = speculation.loaded_why(self.engine, self.draft_why)  # what loaded, not what was planned

    @property
    def model_name(self) -> str:
        """The name responses report: the first --served-model-name, else the model's name."""
        return self.settings.aliases[0] if self.settings.aliases else self.name

    @property
    def model_names(self) -> list[str]:
        return list(dict.fromkeys([self.name, *self.settings.aliases]))

    @property
    def n_ctx(self) -> int:
        """The context it was loaded with (tokens a request may hold)."""
        return self.engine.target.n_ctx

    @property
    def trained_ctx(self) -> int:
        """The longest context its model was trained on (0: the header does not say)."""
        return self.engine.target_model.info.context_length or 0

    @property
    def proposer_name(self) -> str | None:
        return speculation.proposer_name(self.engine, self.settings.speculation)

    @property
    def idle(self) -> bool:
        return self.users == 0 and self.worker.busy == 0

    def touch(self) -> None:
        """A request ended (or began): the keep_alive counts again from now."""
        self.last_used = time.monotonic()
        self.expires_at = math.inf if self.pinned or math.isinf(self.keep_alive) else time.time() + self.keep_alive

    def build_request(self, asked: Asked, grammars: Grammars | None = None) -> Request:
        """The checked engine Request for `asked` (request.py; `grammars`: those compiled before)."""
        return build_request(self.engine, self.settings, asked, grammars)

    async def prepare(self, asked: Asked, grammars: Grammars | None = None) -> Request:
        """build_request on a thread: a chat template renders there, bounded (prompting/sandbox.py), and
        a slow one never holds up the event loop, so every other route keeps answering."""
        return await asyncio.to_thread(self.build_request, asked, grammars)

    def summary(self, result: Result) -> dict:
        """The `speculation` extension field every response carries, with why this draft."""
        return speculation.summary(self.engine, self.settings.speculation, result) | (
            {"draft_reason": self.draft_why} if self.draft_why else {}
        )

    def submit(self, request: Request, route: str) -> Job:
        """Queue the request; 503 when the queue is full."""
        try:
            return self.worker.submit(request, route)
        except QueueFull:
            self.metrics.rejected.inc()
            raise

    async def call(self, work: Callable[[], T]) -> T:
        """Run other work on the engine (an embedding) in the same queue."""
        try:
            return await self.worker.call(work)
        except QueueFull:
            self.metrics.rejected.inc()
            raise

    def close(self) -> None:
        """Stop its generations and free both models (blocks: run it on a thread). Whoever decides to close
        it sets `closed` first, on the event loop, so that no request takes it while this runs."""
        self.closed = True
        if self._freed:
            return
        self._freed = True
        self.worker.close()
        if not self.pinned:  # a pinned engine is its owner's to close
            self.engine.close()

    def _finished(self, job: Job, result: Result) -> None:
        """Count the request and log one line: what the speculation did for it."""
        spec = result.speculation
        self.metrics.record(result)
        self.metrics.requests.labels(job.label, result.finish_reason).inc()
        log.info(
            "%s: %d prompt tokens (%d cached), %d generated in %.2f s, %.1f tok/s, finish %s; "
            "drafted %d, accepted %d (%.0f%%), %.2f tokens per target pass",
            job.label,
            result.prompt_tokens,
            spec.prompt_cached,
            len(result.tokens),
            result.total_seconds,
            result.tokens_per_second,
            result.finish_reason,
            spec.drafted,
            spec.accepted,
            100 * spec.acceptance_rate,
            spec.mean_accepted_per_step,
        )
