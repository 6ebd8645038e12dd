"""The server's state: the loaded pair (the engine), the worker that runs it, the settings and the metrics."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from ollama_spec.engine.engine import Engine, Request, Result
from ollama_spec.errors import OllamaSpecError
from ollama_spec.server.core import speculation
from ollama_spec.server.core.errors import ApiError, failure
from ollama_spec.server.core.request import Asked, build_request
from ollama_spec.server.core.settings import ServerSettings
from ollama_spec.server.metrics import Metrics
from ollama_spec.server.worker import Job, QueueFull, Worker

log = logging.getLogger("ollama_spec.server")
T = TypeVar("T")


@dataclass
class ServerState:
    """The loaded pair and everything the routes share."""

    engine: Engine
    settings: ServerSettings
    worker: Worker = field(init=False)
    metrics: Metrics = field(init=False)
    started: float = field(default_factory=time.time)

    def __post_init__(self) -> None:
        self.metrics = Metrics(lambda: self.worker.waiting)
        self.worker = Worker(self.engine, self.settings.max_queue, self._finished)

    @property
    def model_name(self) -> str:
        """The name responses report: the first --served-model-name, else the target's Ollama name."""
        return self.settings.aliases[0] if self.settings.aliases else self.engine.target_model.name

    @property
    def model_names(self) -> list[str]:
        return list(dict.fromkeys([self.engine.target_model.name, *self.settings.aliases]))

    @property
    def proposer_name(self) -> str | None:
        return speculation.proposer_name(self.engine, self.settings.speculation)

    def build_request(self, asked: Asked) -> Request:
        """The checked engine Request for `asked` (request.py)."""
        return build_request(self.engine, self.settings, asked)

    async def prepare(self, asked: Asked) -> Request:
        """build_request on a thread: a chat template renders there, bounded (prompting/sandbox.py), and
        a slow one never holds up the event loop, so every other route keeps answering."""
        return await asyncio.to_thread(self.build_request, asked)

    def summary(self, result: Result) -> dict:
        """The `speculation` extension field every response carries."""
        return speculation.summary(self.engine, self.settings.speculation, result)

    def submit(self, request: Request, route: str) -> Job:
        """Queue the request; 503 when the queue is full."""
        try:
            return self.worker.submit(request, route)
        except QueueFull as exc:
            self.metrics.rejected.inc()
            raise ApiError.busy(exc) from None

    async def call(self, work: Callable[[], T]) -> T:
        """Run other work on the engine (an embedding) in the same queue; its error as an HTTP error."""
        try:
            return await self.worker.call(work)
        except OllamaSpecError as exc:
            if isinstance(exc, QueueFull):
                self.metrics.rejected.inc()
            raise failure(exc) from None

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
