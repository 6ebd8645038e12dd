"""Ollama-compatible generation: /api/chat and /api/generate (NDJSON streaming by default), and the
answer to Ollama's model-management routes. Field names follow Ollama's api/types.go, so Ollama's own
clients and front-ends parse the answers. (/api/tags, /api/show, /api/ps and the rest: ollama_models.py.)"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import AsyncIterator
from datetime import datetime, timezone
from typing import Any, Literal, get_args

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ollama_spec.prompting.messages import ROLES, ChatMessage
from ollama_spec.engine.engine import Result
from ollama_spec.errors import InvalidSetting
from ollama_spec.decoding.penalties import OPTIONS as PENALTY_OPTIONS
from ollama_spec.prompting.messages import ToolCall
from ollama_spec.server import go_template
from ollama_spec.server.answer import AnswerParts
from ollama_spec.server.common import ApiError, NullsAsDefaults, ServerState, failure, json_grammar, run_to_end
from ollama_spec.server.ollama_models import iso
from ollama_spec.server.worker import Failed, Job, Piece

router = APIRouter()

MANAGEMENT = ("create", "copy", "delete", "push", "blobs")  # Ollama's routes that change its store
# Go's time.ParseDuration syntax: "0", or numbers each with a unit ("1h30m", "-1s", "2.5m").
GO_DURATION = re.compile(r"[-+]?(0|((\d+(\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h))+)")
# A cancelled generation never reaches a client as finished: it ends with an error (see worker.py).
DONE_REASONS = {"stop": "stop", "length": "length", "context": "length"}


class Options(BaseModel):
    """The options Ollama's runner takes that apply here; others (num_gpu, mirostat, ...) are ignored.
    Read with `from_map`, which types them as Ollama does."""

    model_config = ConfigDict(extra="ignore")

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    num_predict: int | None = None  # below 0: until the context is full (-2: fill it)
    num_ctx: int | None = None
    stop: list[str] | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None

    def as_llama_cpp_reads(self) -> Options:
        """Ollama checks the options' types, not their ranges, and llama.cpp makes sense of any value:
        a temperature below 0 is greedy, top_k below 1 and top_p above 1 are off, top_p at or below 0
        and min_p above 1 keep the best token only; a context or repeat penalty of 0 or less is the
        default, a repeat window below -1 the context (-1)."""
        def positive(value):
            return value if value is None or value > 0 else None

        return self.model_copy(update={
            "temperature": None if self.temperature is None else max(self.temperature, 0.0),
            "top_k": None if self.top_k is None else max(self.top_k, 0),
            "top_p": None if self.top_p is None else min(max(self.top_p, 1e-9), 1.0),
            "min_p": None if self.min_p is None else min(max(self.min_p, 0.0), 1.0),
            "num_ctx": positive(self.num_ctx), "repeat_penalty": positive(self.repeat_penalty),
            "repeat_last_n": None if self.repeat_last_n is None else max(self.repeat_last_n, -1),
        })

    @classmethod
    def from_map(cls, given: dict[str, Any] | None) -> Options:
        """The options as Ollama's api.Options.FromMap types them: any JSON number where an integer
        is due (cut to one), no text for a number (pydantic would read "5" as 5), a list of strings for
        stop; null leaves the default. Then the ranges above."""
        values = {}
        for key, value in (given or {}).items():
            field = cls.model_fields.get(key)
            if field is None or value is None:
                continue
            kind = _option_kind(field.annotation)
            if kind == "array":
                if not isinstance(value, list):
                    raise ApiError(400, f'option "{key}" must be of type array')
                if not all(isinstance(item, str) for item in value):
                    raise ApiError(400, f'option "{key}" must be of an array of strings')
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ApiError(400, f'option "{key}" must be of type {kind}')
            values[key] = int(value) if kind == "integer" else value
        try:
            return cls(**values)
        except ValidationError as exc:
            error = exc.errors()[0]
            raise ApiError(400, f"options.{'.'.join(map(str, error['loc']))}: {error['msg']}") from None


def _option_kind(annotation: Any) -> str:
    """Ollama's name for an option's type, as its errors say it."""
    kinds = get_args(annotation) or (annotation,)
    return "integer" if int in kinds else "float32" if float in kinds else "array"


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="ignore")  # index
    name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")  # id
    function: FunctionCall


class Message(NullsAsDefaults):
    model_config = ConfigDict(extra="ignore")  # thinking

    role: Literal[ROLES]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None  # a tool's answer: which tool answered

    @model_validator(mode="before")
    @classmethod
    def _as_ollama_reads(cls, data: Any) -> Any:
        """Ollama lowercases the role; developer is OpenAI's newer name for system."""
        if isinstance(data, dict) and isinstance(data.get("role"), str):
            role = data["role"].lower()
            data = data | {"role": "system" if role == "developer" else role}
        return data

    def to_chat(self) -> ChatMessage:
        calls = tuple(ToolCall(c.function.name, c.function.arguments) for c in self.tool_calls or [])
        return ChatMessage(self.role, self.content, calls, tool_name=self.tool_name)


class InferenceRequest(NullsAsDefaults):
    model_config = ConfigDict(extra="ignore")

    model: str
    keep_alive: int | float | str | None = None  # the pair stays loaded; 0 with nothing to do asks to unload
    stream: bool = True
    options: dict[str, Any] | None = None  # Options, typed by Options.from_map as Ollama types them
    format: str | dict[str, Any] | None = None  # "json", or a JSON schema: the output is constrained to it
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    think: bool | Literal["low", "medium", "high", "max"] | None = None  # levels (gpt-oss) think as true does

    @field_validator("keep_alive", mode="before")
    @classmethod
    def _a_duration(cls, value: Any) -> Any:
        """Seconds, or a Go duration ("5m", "1h30m", "-1s"), as Ollama's api.Duration reads it."""
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ValueError(f"unsupported type {type(value).__name__}: give seconds or a duration such as \"5m\"")
        if isinstance(value, str) and not GO_DURATION.fullmatch(value.strip()):
            raise ValueError(f'time: invalid duration "{value}"')  # Go's words
        return value

    @property
    def thinks(self) -> bool | None:
        return None if self.think is None else self.think is not False

    @property
    def load_reason(self) -> str:
        """A request with nothing to generate: Ollama's way to load a model, or with keep_alive 0 to
        unload it (answered as Ollama does; the served pair stays loaded)."""
        unload = str(self.keep_alive).strip().rstrip("smh") in ("0", "0.0") if self.keep_alive is not None else False
        return "unload" if unload else "load"

    @property
    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def grammar(self) -> str | None:
        if self.format is None or self.format == "":
            return None
        if self.format == "json":
            return json_grammar()
        if isinstance(self.format, dict):
            return json_grammar(self.format)
        raise ApiError(400, f"invalid format '{self.format}': use \"json\" or a JSON schema")


class ChatRequest(InferenceRequest):
    messages: list[Message] | None = None
    tools: list[dict] | None = None
    truncate: bool = True  # a history longer than the context loses its oldest messages (false: a 400)


class GenerateRequest(InferenceRequest):
    prompt: str = ""
    system: str | None = None
    template: str | None = None  # overrides the model's: see go_template.py for what is supported
    raw: bool = False
    images: list[str] | None = None
    context: list[int] | None = None  # deprecated by Ollama, still sent by older clients
    suffix: str | None = None  # fill in the middle (code completion): the text after the gap
    truncate: bool = True  # a prompt longer than the context is cut as Ollama cuts it (false: a 400)


@router.post("/api/chat")
async def chat(body: ChatRequest, http_request: HTTPRequest):
    state: ServerState = http_request.app.state.server
    if not body.messages:  # Ollama's way to load a model: nothing to generate
        return _final(body.model, {"message": {"role": "assistant", "content": ""}}, body.load_reason)
    if any(m.images for m in body.messages):
        raise ApiError(400, "images are not supported: the loaded models read text only")
    tools = body.tools or []
    request = await state.prepare(messages=[m.to_chat() for m in body.messages], grammar=body.grammar(),
                                  tools=tools, logprobs=body.logprob_count, think=body.thinks, truncate=body.truncate,
                                  **_options(body.options))
    job = state.submit(request, "/api/chat")

    def piece(text: str, thought: str = "", calls: list[ToolCall] = ()) -> dict:
        message = {"role": "assistant", "content": text} | ({"thinking": thought} if thought else {})
        if calls:  # ids as Ollama gives them, for clients that answer a call by its id
            message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:8]}",
                                      "function": {"index": i, "name": c.name, "arguments": c.arguments}}
                                     for i, c in enumerate(calls)]
        return {"message": message}

    if body.stream:
        return _ndjson(_chunks(state, body.model, job, piece, parts=state.answer_parts(request),
                               logprobs=body.logprobs))
    result = await run_to_end(job, http_request)
    thought, text, calls = state.answer_parts(request).whole(result.text)
    return _finished(state, body.model, piece(text, thought, calls) | _logprobs(state, body, result), result)


@router.post("/api/generate")
async def generate(body: GenerateRequest, http_request: HTTPRequest):
    state: ServerState = http_request.app.state.server
    if body.raw and (body.template or body.system or body.context):
        raise ApiError(400, "raw mode does not support template, system, or context")  # Ollama's words
    if not body.prompt:  # Ollama's way to load a model: nothing to generate
        return _final(body.model, {"response": ""}, body.load_reason)
    if body.images:
        raise ApiError(400, "images are not supported: the loaded models read text only")
    request = await state.prepare(prompt=body.prompt, system=body.system, raw=body.raw or bool(body.template),
                                  grammar=body.grammar(), context=body.context or (), logprobs=body.logprob_count,
                                  think=body.thinks, suffix=body.suffix or None, tokens=_templated(state, body),
                                  truncate=body.truncate, **_options(body.options))
    job = state.submit(request, "/api/generate")
    prompt = request.tokens

    def piece(text: str, thought: str = "", calls: list[ToolCall] = ()) -> dict:
        return {"response": text} | ({"thinking": thought} if thought else {})

    def ending(result: Result) -> dict:  # the tokens a next request may send back as its context (not raw's)
        return {} if body.raw else {"context": [*prompt, *result.tokens]}

    if body.stream:
        return _ndjson(_chunks(state, body.model, job, piece, ending, parts=state.answer_parts(request),
                               logprobs=body.logprobs))
    result = await run_to_end(job, http_request)
    thought, text, _ = state.answer_parts(request).whole(result.text)
    return _finished(state, body.model, piece(text, thought) | ending(result) | _logprobs(state, body, result), result)


def _templated(state: ServerState, body: GenerateRequest) -> list[int]:
    """The prompt through the request's own template, as tokens; none without one."""
    if not body.template:
        return []
    if body.suffix:
        raise ApiError(400, "give template or suffix, not both: a suffix is laid out with the model's own tokens")
    system = body.system if body.system is not None else state.engine.target_model.system
    try:
        text = go_template.render(body.template, prompt=body.prompt, system=system or "")
    except InvalidSetting as exc:
        raise ApiError(400, str(exc), "template") from None
    if not text:  # no prompt to continue: never fall back to the model's own template unasked
        raise ApiError(400, "the template renders an empty prompt", "template")
    return state.engine.templated_tokens(text)


def _logprobs(state: ServerState, body: InferenceRequest, result: Result) -> dict:
    return {"logprobs": state.scored(result.scored)} if body.logprobs else {}


@router.api_route("/api/{action:path}", methods=["POST", "DELETE", "HEAD"], include_in_schema=False)
async def unsupported(action: str):
    """Last of the routes, so that it answers only what no other route does. Model management
    (create, copy, delete, push, blobs) is Ollama's: this server serves one pair."""
    if action.split("/")[0] not in MANAGEMENT:
        raise ApiError(404, "Not Found")
    raise ApiError(501, f"/api/{action.split('/')[0]} is not supported by ollama-spec serve, which serves one "
                        "loaded pair; manage models with Ollama itself (ollama create, cp, rm, push)")


def _options(given: dict[str, Any] | None) -> dict[str, Any]:
    options = Options.from_map(given).as_llama_cpp_reads()
    predict = options.num_predict
    if predict == 0:
        raise ApiError(400, "num_predict 0 asks for no tokens: give a positive number, or -1 (until the context "
                            "is full)")
    return {
        "temperature": options.temperature, "top_k": options.top_k, "top_p": options.top_p, "min_p": options.min_p,
        "seed": options.seed, "stop": options.stop or [], "n_ctx": options.num_ctx,
        "max_tokens": predict if predict and predict > 0 else None, "max_tokens_name": "num_predict",
        "cap_max_tokens": True,  # as Ollama's boundedNumPredict: an upper bound, never a reason to refuse
        "penalties": {name: value for name in PENALTY_OPTIONS if (value := getattr(options, name)) is not None},
    }


async def _chunks(state: ServerState, model: str, job: Job, piece, ending=lambda result: {},
                  parts: AnswerParts | None = None, logprobs: bool = False) -> AsyncIterator[dict]:
    """The NDJSON objects: text pieces (with their tokens' logprobs when asked; a thinking model's
    thinking apart; tool calls, when the answer was one, as Ollama sends them: in a piece of their
    own), then the final object with the counts."""
    parts = parts or AnswerParts()

    def chunk(fields: dict, scored: tuple) -> dict:
        extra = {"logprobs": state.scored(scored)} if logprobs and scored else {}
        return {"model": model, "created_at": _now()} | fields | extra | {"done": False}

    try:
        async for event in job.events():
            if isinstance(event, Piece):
                thought, text = parts.push(event.text)
                if thought or text:
                    yield chunk(piece(text, thought), event.scored)
            elif isinstance(event, Failed):
                yield {"error": failure(event.error).message}  # Ollama reports mid-stream errors this way
            else:
                thought, text, calls = parts.finish()
                if thought or text or calls or (logprobs and event.scored):
                    yield chunk(piece(text, thought, calls), event.scored)
                yield _finished(state, model, piece("") | ending(event.result), event.result)
    finally:
        job.cancel()  # a no-op once finished; stops the generation when the client has gone


def _finished(state: ServerState, model: str, fields: dict, result: Result) -> dict:
    """Ollama's final object: done, done_reason and its counts and durations (nanoseconds)."""
    ns = 1_000_000_000
    return _final(model, fields, DONE_REASONS[result.finish_reason]) | {
        "total_duration": int(result.total_seconds * ns),
        "load_duration": 0,  # loaded once, when the server started
        "prompt_eval_count": result.prompt_tokens,
        "prompt_eval_duration": int(result.first_token_seconds * ns),
        "eval_count": len(result.tokens),
        "eval_duration": int((result.total_seconds - result.first_token_seconds) * ns),
        "speculation": state.summary(result),
    }


def _final(model: str, fields: dict, reason: str) -> dict:
    return {"model": model, "created_at": _now()} | fields | {"done": True, "done_reason": reason}


def _ndjson(chunks: AsyncIterator[dict]) -> StreamingResponse:
    async def lines() -> AsyncIterator[str]:
        async for chunk in chunks:
            yield json.dumps(chunk) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


def _now() -> str:
    return iso(datetime.now(timezone.utc))
