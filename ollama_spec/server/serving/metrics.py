"""Cumulative counters for GET /metrics (Prometheus text format), one registry per server."""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ollama_spec.engine.engine import Result

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # the text format every Prometheus scraper reads
# Without this every counter gets a `_created` timestamp series too: noise for a single server.
prometheus_client.disable_created_metrics()
# The routes that generate: their requests are counted by outcome, the refused ones too (CountRefusals).
GENERATION_ROUTES = frozenset(
    ("/api/chat", "/api/generate", "/v1/chat/completions", "/v1/completions", "/v1/responses")
)
REFUSED = "refused"  # the outcome of a generation request answered with a 4xx


class Metrics:
    def __init__(self, waiting: Callable[[], float]):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "ollama_spec_requests",
            "Generation requests, by API route and outcome: a finish reason, cancelled, or refused (a 4xx).",
            ["route", "outcome"],
            registry=r,
        )
        self.rejected = Counter(
            "ollama_spec_rejected_requests", "Requests refused because the queue was full.", registry=r
        )
        self.prompt_tokens = Counter("ollama_spec_prompt_tokens", "Prompt tokens of finished requests.", registry=r)
        self.prompt_cached_tokens = Counter(
            "ollama_spec_prompt_cached_tokens",
            "Prompt tokens reused from the KV cache (not evaluated again).",
            registry=r,
        )
        self.generated_tokens = Counter("ollama_spec_generated_tokens", "Tokens generated.", registry=r)
        self.drafted_tokens = Counter("ollama_spec_drafted_tokens", "Tokens proposed by the draft.", registry=r)
        self.accepted_tokens = Counter("ollama_spec_accepted_tokens", "Drafted tokens the target accepted.", registry=r)
        self.target_passes = Counter(
            "ollama_spec_target_passes", "Target forward passes (speculation steps).", registry=r
        )
        self.generation_seconds = Counter("ollama_spec_generation_seconds", "Time spent generating.", registry=r)
        queue = Gauge("ollama_spec_queue_waiting", "Requests waiting behind the running one.", registry=r)
        queue.set_function(waiting)

    def record(self, result: Result) -> None:
        spec = result.speculation
        self.prompt_tokens.inc(result.prompt_tokens)
        self.prompt_cached_tokens.inc(spec.prompt_cached)
        self.generated_tokens.inc(len(result.tokens))
        self.drafted_tokens.inc(spec.drafted)
        self.accepted_tokens.inc(spec.accepted)
        self.target_passes.inc(spec.steps)
        self.generation_seconds.inc(result.total_seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)


class CountRefusals:
    """ASGI middleware: a generation route answered with a 4xx (a malformed body, a bad option, an
    unknown model, a prompt too long) counts as that route's request with the outcome "refused". Such
    a request never finished a generation, so the worker never counted it."""

    def __init__(self, app: ASGIApp, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in GENERATION_ROUTES:
            return await self.app(scope, receive, send)

        async def counted(message: Message) -> None:
            if message["type"] == "http.response.start" and 400 <= message["status"] < 500:
                self.metrics.requests.labels(scope["path"], REFUSED).inc()
            await send(message)

        await self.app(scope, receive, counted)
