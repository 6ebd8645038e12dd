"""OpenAI's protocol for chat, completions and embeddings: the request models. (The answers and chunks the
completion routes give: answers.py; the Responses API's own items: responses.py.)"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

from fastapi import Request as HTTPRequest
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ollama_spec.engine.engine import Request, Result
from ollama_spec.errors import InvalidRequest
from ollama_spec.prompting.messages import ChatMessage
from ollama_spec.server.protocol.shared import NullsAsDefaults, ToolCallIn, chat_role
from ollama_spec.server.protocol.stream import run_to_end
from ollama_spec.server.serving.embedding import texts_only
from ollama_spec.server.serving.loaded import Served
from ollama_spec.server.serving.request import json_grammar, offer_tools

MAX_CHOICES = 16  # n (times the prompts of a batch) bounds the generations one request queues
# What the loaded models cannot read, in the words of the 400 that refuses it.
NOT_TEXT = {"image_url": "images are", "input_audio": "audio is", "file": "files are"}


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")  # image_url, input_audio, file: refused by text_only()

    type: str
    text: str | None = None
    refusal: str | None = None  # an assistant's earlier refusal, read as its text


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer to one of them
    name: str | None = None

    def to_chat(self) -> ChatMessage:
        content = (
            self.content
            if isinstance(self.content, str)
            else "".join(p.text or p.refusal or "" for p in self.content or [])
        )
        calls = tuple(call.to_call() for call in self.tool_calls or [])
        return ChatMessage(chat_role(self.role), content, calls, self.tool_call_id, self.name)


def text_only(messages: list[Message]) -> None:
    """A clear 400 for content the loaded models cannot read (images, audio, files), naming the part."""
    for i, message in enumerate(messages):
        for j, part in enumerate(message.content if isinstance(message.content, list) else []):
            if part.type not in ("text", "refusal"):
                what = NOT_TEXT.get(part.type, f"content parts of type '{part.type}' are")
                raise InvalidRequest(
                    f"{what} not supported: the loaded models read text only", f"messages.[{i}].content.[{j}]"
                )


class JsonSchema(BaseModel):
    model_config = ConfigDict(extra="ignore")  # name, description, strict: the schema is always kept to

    schema_: dict | None = Field(None, alias="schema")


class ResponseFormat(BaseModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchema | None = None


class StreamOptions(BaseModel):
    include_usage: bool = False


class CommonParams(NullsAsDefaults):
    """Fields both completion routes take; unknown fields are ignored, as other servers do."""

    model_config = ConfigDict(extra="ignore")

    model: str
    max_tokens: int | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = Field(1, ge=1, le=MAX_CHOICES)  # choices are generated one after another
    stream: bool = False
    stream_options: StreamOptions | None = None
    # Extensions that vLLM also accepts.
    top_k: int | None = Field(None, ge=0)
    min_p: float | None = Field(None, ge=0, le=1)
    ignore_eos: bool = False
    response_format: ResponseFormat | None = None
    grammar: str | None = None  # a GBNF grammar, as llama.cpp's server and llama-cpp-python's take
    top_logprobs: int | None = Field(None, ge=0, le=20)
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    logit_bias: dict[str, float] | None = None  # token id (as text) -> -100..100 added to its logit
    show_draft: bool = False  # ours: each choice's draft_spans, the characters the draft wrote (draft_spans.py)

    def penalties(self) -> dict:
        """OpenAI's penalties as llama.cpp's (which llama.cpp's own server maps them to); a bias of -100
        bans the token, as OpenAI's reference says it should."""
        given = {
            name: value
            for name in ("presence_penalty", "frequency_penalty")
            if (value := getattr(self, name)) is not None
        }
        if self.logit_bias:
            bias = []
            for key, value in self.logit_bias.items():
                if not (key.strip().isascii() and key.strip().isdigit()):  # "²" is a digit to Python, not to int()
                    raise InvalidRequest(f"logit_bias: keys are token ids, got '{key}'", "logit_bias")
                if not -100 <= value <= 100:
                    raise InvalidRequest(f"logit_bias: values are in -100..100, got {value}", "logit_bias")
                bias.append((int(key), float("-inf") if value == -100 else value))
            given["logit_bias"] = tuple(bias)
        return given

    def output_grammar(self) -> str | None:
        """The grammar the output must match: response_format's JSON (object or schema), or `grammar`."""
        form = self.response_format
        if form is not None and form.type != "text":
            if self.grammar is not None:
                raise InvalidRequest("give response_format or grammar, not both", "grammar")
            schema = form.json_schema.schema_ if form.type == "json_schema" and form.json_schema else None
            return json_grammar(schema, "response_format")
        return self.grammar

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self) -> dict:
        """The sampling fields of an Asked, the output grammar among them."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "seed": self.seed,
            "stop": self.stops,
            "ignore_eos": self.ignore_eos,
            "grammar": self.output_grammar(),
            "penalties": self.penalties(),
        }

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(CommonParams):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    tools: list[dict] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict | None = None
    reasoning_effort: str | None = None  # a thinking model: "none" answers at once; any other level thinks
    # OpenAI's deprecated names for tools and tool_choice: refused by name, never ignored (the model
    # would answer without the functions and the client would wait for a function_call)
    functions: list | None = None
    function_call: str | dict | None = None

    @model_validator(mode="after")
    def _no_legacy_functions(self) -> ChatCompletionRequest:
        if self.functions is not None or self.function_call is not None:
            raise InvalidRequest(
                "functions and function_call are OpenAI's deprecated names: send the functions as "
                'tools=[{"type": "function", "function": {...}}] and choose with tool_choice',
                "functions",
            )
        return self

    def think(self) -> bool | None:
        return None if self.reasoning_effort is None else self.reasoning_effort != "none"

    def offered_tools(self, constrained: bool) -> tuple[list[dict], str | None]:
        """The tools to show the model, and the grammar that forces a call (tool_choice required or named);
        `constrained`: the request has its own output grammar."""
        choice = self.tool_choice
        only = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        if isinstance(choice, dict) and not isinstance(only, str):
            raise InvalidRequest(
                'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
                "tool_choice",
            )
        return offer_tools(self.tools or [], choice, only, constrained)


class CompletionRequest(CommonParams):
    prompt: str | list[str] | list[int] | list[list[int]]  # texts, or token ids (this model's own, as vLLM reads them)
    logprobs: int | None = Field(None, ge=0, le=5)  # the older API: this many alternatives per token
    suffix: str | None = None  # fill in the middle (code completion): the text after the gap
    echo: bool = False  # the prompt, then its completion
    best_of: int | None = Field(None, ge=1)

    def check(self) -> None:
        """What this server cannot do, refused by name rather than ignored."""
        if self.best_of is not None and self.best_of not in (1, self.n):
            raise InvalidRequest(
                f"best_of {self.best_of} is not supported: this server returns every completion it "
                "generates; ask for n completions instead",
                "best_of",
            )
        if self.echo and self.logprobs is not None:
            raise InvalidRequest("echo with logprobs is not supported: the prompt's own tokens are not scored", "echo")


class EmbeddingsRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")  # user

    model: str
    input: str | list[str]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(None, ge=1)

    _text_only = model_validator(mode="before")(texts_only)


def each_input(given: str | list) -> list[str | list[int]]:
    """A prompt or an input as OpenAI takes them (a text, texts, token ids, lists of token ids), one by one."""
    if isinstance(given, list) and given and all(isinstance(t, int) for t in given):
        return [given]  # one, as token ids
    return [given] if isinstance(given, str) else list(given)


def one_stream(choices: int) -> None:
    if choices > 1:
        raise InvalidRequest("streaming gives one choice: ask for n = 1 and one prompt, or do not stream", "n")


def copies(request: Request, n: int) -> list[Request]:
    """n requests for n choices; a seeded one gets seed, seed + 1, ... so that the choices differ."""
    seed = request.sampling.seed
    return [
        request if seed is None or i == 0 else replace(request, sampling=replace(request.sampling, seed=seed + i))
        for i in range(n)
    ]


async def run_all(state: Served, http_request: HTTPRequest, requests: list[Request], route: str) -> list[Result]:
    """Each request run to its end, one after another (a client that leaves cancels the one running)."""
    return [await run_to_end(state.submit(request, route), http_request) for request in requests]
