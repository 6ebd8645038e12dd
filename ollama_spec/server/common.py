"""What both APIs share: server settings, request building and checking, the statistics they report."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence
from typing import Any
from dataclasses import dataclass, field, replace

from pydantic import BaseModel, model_validator
from starlette.requests import Request as HTTPRequest

from ollama_spec.prompting.messages import ChatMessage
from ollama_spec.engine.engine import Engine, Request, Result
from ollama_spec.errors import InvalidSetting, OllamaSpecError
from ollama_spec.llama.grammar import grammar_for_json
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.decoding.loop import SpeculationSettings, Token
from ollama_spec.prompting.thinking import ThinkingSplit, opened_by_prompt, template_thinks
from ollama_spec.prompting.tools import forced_call_grammar, tool_names
from ollama_spec.server.answer import AnswerParts
from ollama_spec.server.metrics import Metrics
from ollama_spec.server.worker import Cancelled, Failed, Finished, Job, QueueFull, Worker

log = logging.getLogger("ollama_spec.server")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_QUEUE = 64
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ServerSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    aliases: tuple[str, ...] = ()  # --served-model-name: more names /v1/models lists
    max_queue: int = DEFAULT_MAX_QUEUE
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    origins: tuple[str, ...] = ()  # web pages whose scripts may call us, beside localhost's (OLLAMA_ORIGINS)
    # Per-request defaults: the command's flags, else the model's Ollama params, else Ollama's.
    sampling: SamplingSettings = SamplingSettings()
    speculation: SpeculationSettings = SpeculationSettings()
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None  # None: up to the end of the context

    def __post_init__(self) -> None:
        if self.max_queue < 0:
            raise InvalidSetting(f"--max-queue must be >= 0, got {self.max_queue}")
        if not 0 <= self.port <= 65535:
            raise InvalidSetting(f"--port must be in 0..65535, got {self.port}")


class NullsAsDefaults(BaseModel):
    """A request whose JSON nulls leave the fields' defaults, as Go's decoder leaves Ollama's and as
    OpenAI's optional fields read them (clients such as LiteLLM send every unset field as null)."""

    @model_validator(mode="before")
    @classmethod
    def _without_nulls(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class ApiError(Exception):
    """An HTTP error answered in the format of the API that was called; `code` is OpenAI's machine-readable
    name for it (such as "context_length_exceeded"), None where OpenAI gives none."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.headers = headers or {}

    @classmethod
    def busy(cls, exc: QueueFull) -> ApiError:
        """503 for a full queue, with the seconds to wait in Retry-After."""
        return cls(503, str(exc), headers={"Retry-After": str(exc.retry_after)})


OLLAMA_NUM_KEEP = 4  # Ollama's default num_keep: the prompt's first tokens a cut keeps
TOO_LONG = "context_length_exceeded"  # OpenAI's code for a prompt (plus max_tokens) past the context
# OpenAI's error types and codes by status, where the error brings none of its own: OpenAI answers a bad key
# as an invalid request with the code "invalid_api_key"; its codes are strings, or null.
OPENAI_ERROR_TYPES = {500: "server_error", 503: "server_overloaded"}
OPENAI_ERROR_CODES = {401: "invalid_api_key"}


def openai_error(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object: `code` a string or null, never the HTTP status (typed clients parse it as text)."""
    return {"message": message, "type": OPENAI_ERROR_TYPES.get(status, "invalid_request_error"), "param": param,
            "code": code or OPENAI_ERROR_CODES.get(status)}


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

    def _check_token_ids(self, ids: dict[int, float], param: str) -> None:
        n_vocab = self.engine.target.n_vocab
        wrong = next((token for token in ids if not 0 <= token < n_vocab), None)
        if wrong is not None:
            raise ApiError(400, f"{param}: token id {wrong} is not in the model's vocabulary (0..{n_vocab - 1})", param)

    async def prepare(self, **fields: Any) -> Request:
        """build_request on a thread: a chat template renders there, bounded (template_sandbox.py), and
        a slow one never holds up the event loop, so every other route keeps answering."""
        return await asyncio.to_thread(self.build_request, **fields)

    def build_request(
        self,
        *,
        prompt: str = "",
        messages: Sequence[ChatMessage] = (),
        system: str | None = None,
        raw: bool = False,
        max_tokens: int | None = None,
        max_tokens_name: str = "max_tokens",
        stop: Sequence[str] = (),
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        min_p: float | None = None,
        seed: int | None = None,
        ignore_eos: bool = False,
        n_ctx: int | None = None,
        grammar: str | None = None,
        context: Sequence[int] = (),
        tools: Sequence[dict] = (),
        logprobs: int | None = None,
        think: bool | None = None,
        suffix: str | None = None,
        tokens: Sequence[int] = (),
        cap_max_tokens: bool = False,
        default_max_tokens: int | None = None,
        truncate: bool = False,
        penalties: dict[str, Any] | None = None,
    ) -> Request:
        """A checked engine Request: the prompt fits the context, so does max_tokens, and llama.cpp
        can parse the output grammar.

        `tokens`: the prompt already as tokens (a template the request brought). `cap_max_tokens`: a
        max_tokens past the room left is a cap, as Ollama's num_predict is (else a 400, as OpenAI answers).
        `default_max_tokens`: the route's own default, below the server's. `truncate`: a conversation
        longer than the context loses its oldest messages, as Ollama's /api/chat does, and a prompt still
        too long is cut as Ollama's runner cuts it. `penalties`:
        Penalties fields given by the request (logit_bias as (token id, bias) pairs)."""
        given = {"temperature": temperature, "top_p": top_p, "top_k": top_k, "min_p": min_p, "seed": seed}
        try:
            sampling = replace(self.settings.sampling, **{k: v for k, v in given.items() if v is not None})
            if penalties:
                self._check_token_ids(dict(penalties.get("logit_bias", ())), "logit_bias")
                sampling = replace(sampling, penalties=replace(sampling.penalties, **penalties))
        except InvalidSetting as exc:
            raise ApiError(400, str(exc)) from None
        history = self.engine.target_model.messages  # a Modelfile's MESSAGE lines: Ollama puts them first
        if history and not raw and not tokens and not context and suffix is None:
            messages = [*history, *(messages or [ChatMessage("user", prompt)])]
        request = Request(
            prompt=prompt,
            messages=tuple(messages),
            system=system,
            raw=raw,
            stop=tuple(stop) + self.settings.stop,
            ignore_eos=ignore_eos,
            sampling=sampling,
            speculation=self.settings.speculation,
            grammar=grammar,
            tools=tuple(tools),
            logprobs=logprobs,
            think=think,
            suffix=suffix,
            tokens=tuple(tokens),
        )
        if think and not template_thinks(self.engine.target_model.info.chat_template):
            raise ApiError(400, f"{self.engine.target_model.name} does not support thinking", "think")
        if tools:
            self._check_tools(tools)
        if context:  # Ollama's /api/generate `context`: an earlier exchange's tokens, then this prompt
            request = replace(request, tokens=tuple(self._after_context(context, request)))
        if grammar is not None:
            try:
                self.engine.grammar(grammar).close()
            except InvalidSetting as exc:
                raise ApiError(400, str(exc)) from None
        context = min(n_ctx or self.engine.target.n_ctx, self.engine.target.n_ctx)
        try:  # tokenized once: the generation, and the routes that read the prompt, take these
            request = replace(request, tokens=tuple(self.engine.prompt_tokens(request)))
            if truncate and len(request.tokens) >= context and request.messages:
                request = self._dropping_oldest(request, context)
            if truncate and len(request.tokens) >= context:
                request = self._cut_as_ollama(request, context)
        except InvalidSetting as exc:
            raise ApiError(400, str(exc)) from None
        n_prompt = len(request.tokens)
        room = context - n_prompt
        if room < 1:
            raise ApiError(400, f"the prompt is {n_prompt} tokens but the context holds {context}; shorten it",
                           code=TOO_LONG)
        if max_tokens is not None and max_tokens < 1:
            raise ApiError(400, f"{max_tokens_name} must be at least 1, got {max_tokens}", max_tokens_name)
        if max_tokens is not None and max_tokens > room:
            if not cap_max_tokens:
                raise ApiError(
                    400,
                    f"{max_tokens_name} {max_tokens} is beyond the context: the prompt takes {n_prompt} of its "
                    f"{context} tokens, which leaves {room}",
                    max_tokens_name, TOO_LONG,
                )
            max_tokens = room  # the generation ends there, with finish reason "length"
        limit = max_tokens or min(self.settings.max_tokens or default_max_tokens or room, room)
        return replace(request, max_tokens=limit)

    def _cut_as_ollama(self, request: Request, context: int) -> Request:
        """A prompt still longer than the context, cut as Ollama's runner cuts it: its first
        OLLAMA_NUM_KEEP tokens (and BOS) kept, then its end, to about half the context, so that the
        answer has the other half."""
        tokens = request.tokens
        keep = max(0, min(OLLAMA_NUM_KEEP + int(self.engine.target.add_bos), context - 1))
        limit = context - max((context - keep) // 2, 1)
        if limit < 1:  # Ollama's "no prompt budget": a context of one token holds no prompt and no answer
            raise ApiError(400, f"a context of {context} token leaves no room for a prompt; raise num_ctx", "num_ctx")
        log.warning("the prompt (%d tokens) is longer than the context (%d): cut to %d, keeping its first %d",
                    len(tokens), context, limit, keep)
        return replace(request, tokens=tokens[:keep] + tokens[len(tokens) - (limit - keep):])

    def _dropping_oldest(self, request: Request, context: int) -> Request:
        """The conversation without its oldest messages, as few dropped as make the prompt fit, always
        keeping the system messages and the latest message (Ollama's chatPrompt). When even those do
        not fit, the request with only those: the caller's check then refuses it."""
        messages = request.messages

        def from_(start: int) -> Request | None:  # None: the template refuses this start (an assistant turn first)
            kept = [m for m in messages[:start] if m.role == "system"] + list(messages[start:])
            candidate = replace(request, messages=tuple(kept), tokens=())
            try:
                return replace(candidate, tokens=tuple(self.engine.prompt_tokens(candidate)))
            except InvalidSetting:
                return None

        # Ollama tries each start in turn; the prompt shrinks as the start moves on, so a bisection
        # finds the same start with a handful of renderings (a refused start counts as too long).
        too_long, fits = 0, len(messages) - 1
        shortest = from_(fits)
        if shortest is None or len(shortest.tokens) >= context:
            return shortest or request
        while fits - too_long > 1:
            middle = (too_long + fits) // 2
            candidate = from_(middle)
            if candidate is not None and len(candidate.tokens) < context:
                fits, shortest = middle, candidate
            else:
                too_long = middle
        log.info("the conversation is longer than the context: its oldest %d messages were dropped",
                 len(messages) - len(shortest.messages))
        return shortest

    def think_if_able(self, think: bool | None) -> bool | None:
        """`think` for a thinking model, else None (OpenAI clients send reasoning_effort to any model)."""
        return think if template_thinks(self.engine.target_model.info.chat_template) else None

    def answer_parts(self, request: Request) -> AnswerParts:
        """How this request's answer is split for the client: a thinking model's thinking apart (unless
        it was told not to think), tool calls held back when tools were offered."""
        thinking = None
        if not request.raw and request.think is not False and template_thinks(
                self.engine.target_model.info.chat_template):
            end = self.engine.target.detokenize(self.engine.prompt_tokens(request)[-8:], special=True)
            thinking = ThinkingSplit(thinking=opened_by_prompt(end))
        return AnswerParts(request.tools, thinking)

    def _check_tools(self, tools: Sequence[dict]) -> None:
        try:
            tool_names(list(tools))
        except InvalidSetting as exc:
            raise ApiError(400, str(exc), "tools") from None
        if not self.engine.target_model.info.chat_template:
            raise ApiError(400, f"{self.engine.target_model.name} does not support tools: it has no chat template",
                           "tools")

    def _after_context(self, context: Sequence[int], request: Request) -> list[int]:
        target = self.engine.target
        if any(not 0 <= token < target.n_vocab for token in context):
            raise ApiError(400, f"context holds token ids outside this model's vocabulary (0..{target.n_vocab - 1})",
                           "context")
        try:
            prompt = self.engine.prompt_tokens(request)
        except InvalidSetting as exc:
            raise ApiError(400, str(exc)) from None
        if prompt and target.add_bos and prompt[0] == target.bos_token:
            prompt = prompt[1:]  # one BOS, at the start of the context
        return [*context, *prompt]

    def scored(self, tokens: Sequence[Token]) -> list[dict]:
        """Tokens with their log-probabilities, as both APIs list them: token text, logprob, bytes, top."""
        return [self._scored(t.id, t.logprob) | {"top_logprobs": [self._scored(i, lp) for i, lp in t.top]}
                for t in tokens]

    def _scored(self, token: int, logprob: float) -> dict:
        piece, _ = self.engine.target.token_piece(token)
        return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(piece)}

    @property
    def proposer_name(self) -> str | None:
        """Who drafts: the draft model's name, "ngram" for prompt lookup (--draft ngram), or None."""
        if self.settings.speculation.proposer == "ngram":
            return "ngram"
        return self.engine.draft_model.name if self.engine.draft_model else None

    def summary(self, result: Result) -> dict:
        """The `speculation` extension field every response carries."""
        spec = result.speculation
        return {
            "draft": self.proposer_name,
            "num_speculative_tokens": (self.settings.speculation.num_speculative_tokens
                                       if self.engine.proposer(self.settings.speculation) is not None else 0),
            "drafted_tokens": spec.drafted,
            "accepted_tokens": spec.accepted,
            "acceptance_rate": round(spec.acceptance_rate, 4),
            "tokens_per_target_pass": round(spec.mean_accepted_per_step, 3),
            "tokens_per_second": round(result.tokens_per_second, 2),
            "prompt_tokens": result.prompt_tokens,
            "prompt_cached_tokens": spec.prompt_cached,
            "time_to_first_token_s": round(result.first_token_seconds, 4),
            "total_s": round(result.total_seconds, 4),
        }

    def _finished(self, job: Job, result: Result) -> None:
        """Count the request and log one line: what the speculation did for it."""
        spec = result.speculation
        self.metrics.record(result)
        self.metrics.requests.labels(job.label, result.finish_reason).inc()
        log.info(
            "%s: %d prompt tokens (%d cached), %d generated in %.2f s, %.1f tok/s, finish %s; "
            "drafted %d, accepted %d (%.0f%%), %.2f tokens per target pass",
            job.label, result.prompt_tokens, spec.prompt_cached, len(result.tokens), result.total_seconds,
            result.tokens_per_second, result.finish_reason, spec.drafted, spec.accepted, 100 * spec.acceptance_rate,
            spec.mean_accepted_per_step,
        )

    def submit(self, request: Request, route: str) -> Job:
        """Queue the request; 503 when the queue is full."""
        try:
            return self.worker.submit(request, route)
        except QueueFull as exc:
            self.metrics.rejected.inc()
            raise ApiError.busy(exc) from None


def offer_tools(tools: list[dict], choice: str | dict | None, only: str | None,
                constrained: bool) -> tuple[list[dict], str | None]:
    """The tools to show the model (chat completions' shape) and, for tool_choice "required" or a named
    function (`only`), the grammar that forces one call; `constrained`: the request has its own format."""
    if not tools or choice == "none":
        return [], None
    if choice in (None, "auto"):
        return tools, None
    if constrained:
        raise ApiError(400, "a forced tool call and an output format or grammar cannot be combined", "tool_choice")
    try:
        return tools, forced_call_grammar(tools, only)
    except InvalidSetting as exc:
        raise ApiError(400, str(exc), "tool_choice") from None


def json_grammar(schema: object = None, param: str = "format") -> str:
    """The grammar for a JSON object (schema None) or for JSON matching `schema`; 400 when it cannot be built."""
    try:
        return grammar_for_json(schema)
    except InvalidSetting as exc:
        raise ApiError(400, str(exc), param) from None


async def run_to_end(job: Job, http_request: HTTPRequest) -> Result:
    """Wait for a whole (non-streamed) generation; a client that hangs up cancels it."""
    watcher = asyncio.create_task(_cancel_on_disconnect(job, http_request))
    try:
        async for event in job.events():
            if isinstance(event, Finished):
                return event.result
            if isinstance(event, Failed):
                raise failure(event.error)
    finally:
        watcher.cancel()
        job.cancel()  # a no-op once finished; stops the generation if we are being cancelled
    raise AssertionError("events end with Finished or Failed")


def failure(error: Exception) -> ApiError:
    """A generation's error as an HTTP error: the client's fault (400), ours (500), or a generation the
    server stopped (503: it is shutting down)."""
    if isinstance(error, Cancelled):
        return ApiError(503, str(error))
    if isinstance(error, QueueFull):
        return ApiError.busy(error)
    if isinstance(error, OllamaSpecError):
        return ApiError(400, str(error))
    return ApiError(500, f"generation failed: {type(error).__name__}: {error}")


async def _cancel_on_disconnect(job: Job, http_request: HTTPRequest) -> None:
    while True:
        message = await http_request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return
