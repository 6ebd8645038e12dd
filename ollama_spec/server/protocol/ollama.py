"""Ollama's protocol: the request models of its routes and the objects its answers end with. Field
names follow Ollama's api/types.go, so Ollama's own clients and front-ends parse the answers."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ollama_spec.decoding.penalties import OPTIONS as PENALTY_OPTIONS
from ollama_spec.engine.engine import Result
from ollama_spec.errors import InvalidRequest
from ollama_spec.prompting.messages import ROLES, ChatMessage
from ollama_spec.server.protocol.shared import FunctionCall, NullsAsDefaults, ToolCallIn, chat_role
from ollama_spec.server.serving.embedding import texts_only
from ollama_spec.server.serving.keep_alive import KeepAlive
from ollama_spec.server.serving.request import json_grammar
from ollama_spec.server.serving.state import durations

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

        return self.model_copy(
            update={
                "temperature": None if self.temperature is None else max(self.temperature, 0.0),
                "top_k": None if self.top_k is None else max(self.top_k, 0),
                "top_p": None if self.top_p is None else min(max(self.top_p, 1e-9), 1.0),
                "min_p": None if self.min_p is None else min(max(self.min_p, 0.0), 1.0),
                "num_ctx": positive(self.num_ctx),
                "repeat_penalty": positive(self.repeat_penalty),
                "repeat_last_n": None if self.repeat_last_n is None else max(self.repeat_last_n, -1),
            }
        )

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
                    raise InvalidRequest(f'option "{key}" must be of type array')
                if not all(isinstance(item, str) for item in value):
                    raise InvalidRequest(f'option "{key}" must be of an array of strings')
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise InvalidRequest(f'option "{key}" must be of type {kind}')
            values[key] = int(value) if kind == "integer" else value
        try:
            return cls(**values)
        except ValidationError as exc:
            error = exc.errors()[0]
            raise InvalidRequest(f"options.{'.'.join(map(str, error['loc']))}: {error['msg']}") from None

    def asked(self) -> dict[str, Any]:
        """These options (as llama.cpp reads them) as the fields of an Asked."""
        options = self.as_llama_cpp_reads()
        predict = options.num_predict
        if predict == 0:
            raise InvalidRequest(
                "num_predict 0 asks for no tokens: give a positive number, or -1 (until the context is full)"
            )
        return {
            "temperature": options.temperature,
            "top_k": options.top_k,
            "top_p": options.top_p,
            "min_p": options.min_p,
            "seed": options.seed,
            "stop": options.stop or [],
            "n_ctx": options.num_ctx,
            "max_tokens": predict if predict and predict > 0 else None,
            "max_tokens_name": "num_predict",
            "cap_max_tokens": True,  # as Ollama's boundedNumPredict: an upper bound, never a reason to refuse
            "penalties": {name: value for name in PENALTY_OPTIONS if (value := getattr(options, name)) is not None},
        }


def _option_kind(annotation: Any) -> str:
    """Ollama's name for an option's type, as its errors say it."""
    kinds = get_args(annotation) or (annotation,)
    return "integer" if int in kinds else "float32" if float in kinds else "array"


class ObjectCall(FunctionCall):
    arguments: dict[str, Any] = Field(default_factory=dict)  # an object on Ollama's wire, never JSON text


class ToolCallBack(ToolCallIn):
    function: ObjectCall


class Message(NullsAsDefaults):
    model_config = ConfigDict(extra="ignore")  # thinking

    role: Literal[ROLES]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[ToolCallBack] | None = None
    tool_name: str | None = None  # a tool's answer: which tool answered

    @model_validator(mode="before")
    @classmethod
    def _as_ollama_reads(cls, data: Any) -> Any:
        """Ollama lowercases the role; developer is OpenAI's newer name for system."""
        if isinstance(data, dict) and isinstance(data.get("role"), str):
            data = data | {"role": chat_role(data["role"].lower())}
        return data

    def to_chat(self) -> ChatMessage:
        # Ollama's answers name no call (no tool_call_id): the template numbers the calls
        calls = tuple(replace(c.to_call(), id=None) for c in self.tool_calls or [])
        return ChatMessage(self.role, self.content, calls, tool_name=self.tool_name)


class InferenceRequest(NullsAsDefaults):
    model_config = ConfigDict(extra="ignore")

    model: str
    keep_alive: KeepAlive = None  # seconds the model stays loaded after this request
    stream: bool = True
    options: dict[str, Any] | None = None  # Options, typed by Options.from_map as Ollama types them
    format: str | dict[str, Any] | None = None  # "json", or a JSON schema: the output is constrained to it
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    think: bool | Literal["low", "medium", "high", "max"] | None = None  # levels (gpt-oss) think as true does
    show_draft: bool = False  # ours: draft_spans, the characters of the content the draft wrote (draft_spans.py)

    @property
    def thinks(self) -> bool | None:
        return None if self.think is None else self.think is not False

    @property
    def load_reason(self) -> str:
        """A request with nothing to generate: Ollama's way to load a model, or with keep_alive 0 to
        unload it."""
        return "unload" if self.keep_alive == 0 else "load"

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
        raise InvalidRequest(f"invalid format '{self.format}': use \"json\" or a JSON schema")


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


class ShowRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    name: str | None = None  # older clients


class PullRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # insecure
    model: str | None = None
    name: str | None = None  # older clients
    stream: bool = True


class EmbedRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # options

    model: str
    keep_alive: KeepAlive = None
    input: str | list[str] = Field(default_factory=list)
    truncate: bool = True
    dimensions: int | None = None  # used only between 0 and the vector's size, as Ollama does

    _text_only = model_validator(mode="before")(texts_only)


class EmbeddingsRequest(BaseModel):  # the older route: one prompt, a vector as the model gives it
    model_config = ConfigDict(extra="ignore")

    model: str
    keep_alive: KeepAlive = None
    prompt: str = ""


def finished(model: str, fields: dict, result: Result, speculation: dict) -> dict:
    """Ollama's final object: done, done_reason and its counts and durations (nanoseconds)."""
    ns, took = 1_000_000_000, durations(result)  # as Ollama: from the request's arrival, waits included
    return final(model, fields, DONE_REASONS[result.finish_reason]) | {
        "total_duration": int(took.total * ns),
        "load_duration": int(took.load * ns),
        # the whole prompt, cached or not, as Ollama counts it (Open WebUI takes it for the context's
        # size); the cached part apart, under Ollama's name for it (PR #17943); the duration is the
        # evaluation's alone, so a rate must divide by the evaluated tokens (count - cached)
        "prompt_eval_count": result.prompt_tokens,
        "prompt_eval_cached_count": result.speculation.prompt_cached,
        "prompt_eval_duration": int(took.prompt * ns),
        "eval_count": len(result.tokens),
        "eval_duration": int(took.eval * ns),
        "speculation": speculation,
    }


def final(model: str, fields: dict, reason: str) -> dict:
    return {"model": model, "created_at": now()} | fields | {"done": True, "done_reason": reason}


def now() -> str:
    return iso(datetime.now(timezone.utc))


def iso(moment: datetime) -> str:
    """A time as Ollama writes it: RFC 3339, UTC as Z."""
    return moment.isoformat().replace("+00:00", "Z")
