"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions (SSE when streaming)."""

from __future__ import annotations

import codecs
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from typing import Literal

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, model_validator

from ollama_spec.prompting.messages import ChatMessage
from ollama_spec.engine.engine import Request, Result
from ollama_spec.prompting.messages import ToolCall
from ollama_spec.server.answer import AnswerParts
from ollama_spec.server.common import (ApiError, NullsAsDefaults, ServerState, failure, json_grammar, offer_tools, openai_error,
                     run_to_end)
from ollama_spec.server.worker import Failed, Finished, Job, Piece

router = APIRouter(prefix="/v1")

MAX_CHOICES = 16  # n (times the prompts of a batch) bounds the generations one request queues
COMPLETIONS_MAX_TOKENS = 16  # /v1/completions without max_tokens, as OpenAI's reference gives it
# Our finish reasons in OpenAI's words: a full context is a length limit too. A cancelled generation
# never reaches a client as finished: it ends with an error (see worker.py).
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length"}


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="ignore")  # image_url, input_audio, file: refused by text_only()

    type: str
    text: str | None = None
    refusal: str | None = None  # an assistant's earlier refusal, read as its text


# What the loaded models cannot read, in the words of the 400 that refuses it.
NOT_TEXT = {"image_url": "images are", "input_audio": "audio is", "file": "files are"}


class FunctionCall(BaseModel):
    name: str
    arguments: str | dict = "{}"  # a JSON text, as OpenAI sends it


class ToolCallIn(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: str | None = None
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    # developer is OpenAI's newer name for system
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's answer to one of them
    name: str | None = None

    def to_chat(self) -> ChatMessage:
        content = self.content if isinstance(self.content, str) else "".join(p.text or p.refusal or ""
                                                                             for p in self.content or [])
        calls = tuple(ToolCall(c.function.name, tool_arguments(c.function.arguments), c.id)
                      for c in self.tool_calls or [])
        return ChatMessage("system" if self.role == "developer" else self.role, content, calls, self.tool_call_id,
                           self.name)


def text_only(messages: list[Message]) -> None:
    """A clear 400 for content the loaded models cannot read (images, audio, files), naming the part."""
    for i, message in enumerate(messages):
        for j, part in enumerate(message.content if isinstance(message.content, list) else []):
            if part.type not in ("text", "refusal"):
                what = NOT_TEXT.get(part.type, f"content parts of type '{part.type}' are")
                raise ApiError(400, f"{what} not supported: the loaded models read text only",
                               f"messages.[{i}].content.[{j}]")


def tool_arguments(arguments: str | dict) -> dict | str:
    """A call's arguments from the history: a JSON object as the object (what chat templates read);
    anything else as the text the model wrote (a call cut short, or not JSON at all), which the
    client sends back with its answer that the call was invalid. Templates take such text as
    transformers passes it, a string."""
    if isinstance(arguments, dict):
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


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

    def penalties(self) -> dict:
        """OpenAI's penalties as llama.cpp's (which llama.cpp's own server maps them to); a bias of -100
        bans the token, as OpenAI's reference says it should."""
        given = {name: value for name in ("presence_penalty", "frequency_penalty")
                 if (value := getattr(self, name)) is not None}
        if self.logit_bias:
            bias = []
            for key, value in self.logit_bias.items():
                if not (key.strip().isascii() and key.strip().isdigit()):  # "²" is a digit to Python, not to int()
                    raise ApiError(400, f"logit_bias: keys are token ids, got '{key}'", "logit_bias")
                if not -100 <= value <= 100:
                    raise ApiError(400, f"logit_bias: values are in -100..100, got {value}", "logit_bias")
                bias.append((int(key), float("-inf") if value == -100 else value))
            given["logit_bias"] = tuple(bias)
        return given

    def output_grammar(self) -> str | None:
        """The grammar the output must match: response_format's JSON (object or schema), or `grammar`."""
        form = self.response_format
        if form is not None and form.type != "text":
            if self.grammar is not None:
                raise ApiError(400, "give response_format or grammar, not both", "grammar")
            schema = form.json_schema.schema_ if form.type == "json_schema" and form.json_schema else None
            return json_grammar(schema, "response_format")
        return self.grammar

    @property
    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    def sampling(self) -> dict:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p,
                "seed": self.seed, "stop": self.stops, "ignore_eos": self.ignore_eos, "grammar": self.output_grammar(),
                "penalties": self.penalties()}


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
            raise ApiError(400, "functions and function_call are OpenAI's deprecated names: send the functions as "
                                'tools=[{"type": "function", "function": {...}}] and choose with tool_choice',
                           "functions")
        return self

    def think(self) -> bool | None:
        return None if self.reasoning_effort is None else self.reasoning_effort != "none"

    def offered_tools(self, constrained: bool) -> tuple[list[dict], str | None]:
        """The tools to show the model, and the grammar that forces a call (tool_choice required or named);
        `constrained`: the request has its own output grammar."""
        choice = self.tool_choice
        only = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        if isinstance(choice, dict) and not isinstance(only, str):
            raise ApiError(400, 'tool_choice must be "none", "auto", "required" or {"type": "function", '
                                '"function": {"name": ...}}', "tool_choice")
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
            raise ApiError(400, f"best_of {self.best_of} is not supported: this server returns every completion it "
                                "generates; ask for n completions instead", "best_of")
        if self.echo and self.logprobs is not None:
            raise ApiError(400, "echo with logprobs is not supported: the prompt's own tokens are not scored",
                           "echo")


@router.get("/models")
async def list_models(http_request: HTTPRequest) -> dict:
    state: ServerState = http_request.app.state.server
    created = int(state.started)
    return {
        "object": "list",
        "data": [{"id": name, "object": "model", "created": created, "owned_by": "ollama-spec"}
                 for name in state.model_names],
    }


@router.get("/models/{model:path}")
async def retrieve_model(model: str, http_request: HTTPRequest) -> dict:
    """One model's card: any name is answered by the loaded pair (as the completion routes do)."""
    state: ServerState = http_request.app.state.server
    return {"id": model, "object": "model", "created": int(state.started), "owned_by": "ollama-spec"}


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, http_request: HTTPRequest):
    state: ServerState = http_request.app.state.server
    text_only(body.messages)
    limit, name = _max_tokens(body.max_completion_tokens, "max_completion_tokens", body.max_tokens)
    sampling = body.sampling()  # the output grammar built once: offered_tools only asks whether there is one
    tools, forced = body.offered_tools(sampling["grammar"] is not None)
    if forced:
        sampling["grammar"] = forced
    top = (body.top_logprobs or 0) if body.logprobs else None
    request = await state.prepare(messages=[m.to_chat() for m in body.messages], max_tokens=limit,
                                  max_tokens_name=name, tools=tools, logprobs=top,
                                  think=state.think_if_able(body.think()), **sampling)
    scores = None if top is None else lambda tokens: {"content": state.scored(tokens), "refusal": None}
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": state.model_name}
    if body.stream:
        _one_stream(body.n)
        opening = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        job = state.submit(request, "/v1/chat/completions")
        return _sse(_chunks(state, job, meta | {"object": "chat.completion.chunk"}, _delta, _include_usage(body),
                            opening, state.answer_parts(request), scores))

    def choice(result: Result) -> tuple[dict, str | None]:
        thought, text, calls = state.answer_parts(request).whole(result.text, cut=result.finish_reason == "length")
        message = {"role": "assistant", "content": text or None if calls else text} | _reasoning(thought)
        if calls:
            message["tool_calls"] = _tool_calls(calls)
        return {"message": message, "logprobs": scores(result.scored) if scores else None}, \
            _calls_finish(calls, result)

    results = await _run_all(state, http_request, _copies(request, body.n), "/v1/chat/completions")
    return _answers(state, meta | {"object": "chat.completion"}, [choice(r) for r in results], results, body.n)


@router.post("/completions")
async def completions(body: CompletionRequest, http_request: HTTPRequest):
    state: ServerState = http_request.app.state.server
    given = body.prompt
    if isinstance(given, list) and given and all(isinstance(t, int) for t in given):
        given = [given]  # one prompt as token ids
    prompts = [given] if isinstance(given, str) else list(given)
    if not prompts or any(not prompt for prompt in prompts if not isinstance(prompt, str)):
        raise ApiError(400, "prompt is empty: give a text, a list of texts, or token ids", "prompt")
    if len(prompts) * body.n > MAX_CHOICES:
        raise ApiError(400, f"{len(prompts)} prompts times n={body.n} is more than {MAX_CHOICES} completions", "n")
    body.check()
    n_vocab = state.engine.target.n_vocab
    if any(not 0 <= t < n_vocab for prompt in prompts if not isinstance(prompt, str) for t in prompt):
        raise ApiError(400, f"token ids must be in 0..{n_vocab - 1} (this model's own vocabulary)", "prompt")
    if body.suffix and any(not isinstance(prompt, str) for prompt in prompts):
        raise ApiError(400, "suffix needs the prompt as text: the gap is laid out with the model's own tokens",
                       "suffix")
    requests = [await state.prepare(prompt=prompt if isinstance(prompt, str) else "",
                                    tokens=() if isinstance(prompt, str) else prompt, raw=True,
                                    max_tokens=body.max_tokens, logprobs=body.logprobs, suffix=body.suffix or None,
                                    default_max_tokens=COMPLETIONS_MAX_TOKENS, **body.sampling())
                for prompt in prompts]
    prompts = [p if isinstance(p, str) else state.engine.target.detokenize(p, special=True) for p in prompts]  # echo
    meta = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": state.model_name,
            "object": "text_completion"}
    def scores():  # one choice's logprobs: its text offsets are counted across its chunks
        legacy, target = _LegacyLogprobs(), state.engine.target
        return None if body.logprobs is None else lambda tokens: legacy(
            state.scored(tokens), [not target.token_piece(t.id)[1] for t in tokens])

    if body.stream:
        _one_stream(len(requests) * body.n)
        job = state.submit(requests[0], "/v1/completions")
        opening = {"index": 0, **_text(prompts[0]), "finish_reason": None} if body.echo else None
        return _sse(_chunks(state, job, meta, _text, _include_usage(body), opening, scores=scores()))
    copies = [copy for request in requests for copy in _copies(request, body.n)]  # prompt by prompt, as OpenAI orders
    results = await _run_all(state, http_request, copies, "/v1/completions")
    echoed = [prompt if body.echo else "" for prompt in prompts for _ in range(body.n)]
    choices = [(_text(echo + r.text) | {"logprobs": scored(r.scored) if (scored := scores()) else None}, None)
               for echo, r in zip(echoed, results)]
    return _answers(state, meta, choices, results, body.n)


def _delta(text: str) -> dict:
    return {"delta": {"content": text} if text else {}}


def _text(text: str) -> dict:
    return {"text": text, "logprobs": None}


class _LegacyLogprobs:
    """The completions API's older shape: parallel lists, each token's alternatives as a dict, and
    where each token starts in the choice's text (in characters; a control token's text is not
    part of it). Called chunk by chunk when streaming, it goes on counting from where the last
    chunk ended.

    A token that is part of a character (a byte-fallback token, a split emoji) is named as OpenAI
    names it, "bytes:\\xe4\\xb8", so that alternatives do not collide as one U+FFFD, and takes
    no room in the text until its character is whole.
    """

    def __init__(self):
        self.at = 0
        self.text = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, scored: list[dict], in_text: list[bool]) -> dict:
        offsets = []
        for entry, shown in zip(scored, in_text):
            offsets.append(self.at)
            self.at += len(self.text.decode(bytes(entry["bytes"]))) if shown else 0
        return {"tokens": [_legacy_token(e) for e in scored], "token_logprobs": [e["logprob"] for e in scored],
                "top_logprobs": [{_legacy_token(t): t["logprob"] for t in e["top_logprobs"]} for e in scored],
                "text_offset": offsets}


def _legacy_token(entry: dict) -> str:
    raw = bytes(entry["bytes"])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


def _reasoning(thought: str) -> dict:
    """A thinking model's thinking, under the names clients read it by (Ollama's and DeepSeek's)."""
    return {"reasoning": thought, "reasoning_content": thought} if thought else {}


def _tool_calls(calls: list[ToolCall], streamed: bool = False) -> list[dict]:
    return [{**({"index": i} if streamed else {}), "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": call.name, "arguments": call.cut_arguments if call.cut_arguments is not None
                          else json.dumps(call.arguments)}} for i, call in enumerate(calls)]


def _calls_finish(calls: list[ToolCall], result: Result) -> str | None:
    """"tool_calls" for an answer that called; a call cut by max_tokens keeps "length", as OpenAI's does
    (None: the result's own reason)."""
    return "tool_calls" if calls and result.finish_reason != "length" else None


def _one_stream(choices: int) -> None:
    if choices > 1:
        raise ApiError(400, "streaming gives one choice: ask for n = 1 and one prompt, or do not stream", "n")


def _copies(request: Request, n: int) -> list[Request]:
    """n requests for n choices; a seeded one gets seed, seed + 1, ... so that the choices differ."""
    seed = request.sampling.seed
    return [request if seed is None or i == 0 else replace(request, sampling=replace(request.sampling, seed=seed + i))
            for i in range(n)]


async def _run_all(state: ServerState, http_request: HTTPRequest, requests: list[Request], route: str) -> list[Result]:
    """Each request run to its end, one after another (a client that leaves cancels the one running)."""
    return [await run_to_end(state.submit(request, route), http_request) for request in requests]


def _answers(state: ServerState, meta: dict, choices: list[tuple[dict, str | None]], results: list[Result],
             n: int = 1) -> dict:
    """Several choices in one answer (n per prompt): usage counts each prompt once and every completion."""
    usage = _usage(results[0])
    usage["prompt_tokens"] = sum(r.prompt_tokens for r in results[::n])
    usage["completion_tokens"] = sum(len(r.tokens) for r in results)
    usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
    return meta | {"choices": [{"index": i, **choice, "finish_reason": finish or FINISH_REASONS[r.finish_reason]}
                               for i, ((choice, finish), r) in enumerate(zip(choices, results))],
                   "usage": usage, "speculation": state.summary(results[0])}


def _max_tokens(newer: int | None, newer_name: str, older: int | None) -> tuple[int | None, str]:
    return (newer, newer_name) if newer is not None else (older, "max_tokens")


def _include_usage(body: CommonParams) -> bool:
    return bool(body.stream_options and body.stream_options.include_usage)


def _usage(result: Result) -> dict:
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(result.tokens),
        "total_tokens": result.prompt_tokens + len(result.tokens),
        "prompt_tokens_details": {"cached_tokens": result.speculation.prompt_cached},
    }


async def _chunks(state: ServerState, job: Job, meta: dict, choice: Callable[[str], dict], include_usage: bool,
                  opening: dict | None = None, parts: AnswerParts | None = None,
                  scores: Callable[[tuple], dict] | None = None) -> AsyncIterator[dict]:
    """The streamed chunks: text pieces (with their tokens' logprobs when asked; a thinking model's
    thinking as `reasoning`; tool calls, when the answer was one), the finish reason with the
    speculation field, then usage if asked."""
    parts = parts or AnswerParts()
    if include_usage:  # as OpenAI: every chunk has the key, null but in the last
        meta = meta | {"usage": None}

    def piece(thought: str, text: str, scored: tuple) -> dict:
        body = choice(text)
        if thought:
            body["delta"] = body.get("delta", {}) | _reasoning(thought)
        extra = {"logprobs": scores(scored)} if scores and scored else {}
        return meta | {"choices": [{"index": 0, **body, **extra, "finish_reason": None}]}

    if opening:
        yield meta | {"choices": [opening]}
    async for event in job_events(job):
        if isinstance(event, Piece):
            thought, text = parts.push(event.text)
            if thought or text:
                yield piece(thought, text, event.scored)
        else:
            result = event.result
            thought, text, calls = parts.finish(cut=result.finish_reason == "length")
            if thought or text or event.scored:
                yield piece(thought, text, event.scored)
            if calls:
                delta = {"delta": {"tool_calls": _tool_calls(calls, streamed=True)}}
                yield meta | {"choices": [{"index": 0, **delta, "finish_reason": None}]}
            final = _answers(state, meta, [(choice(""), _calls_finish(calls, result))], [result])
            del final["usage"]  # usage comes in a chunk of its own, when asked for
            yield final | ({"usage": None} if include_usage else {})
            if include_usage:
                yield meta | {"choices": [], "usage": _usage(result)}


async def job_events(job: Job) -> AsyncIterator[Piece | Finished]:
    """The job's pieces and its Finished event; a failure mid-stream is raised as an ApiError."""
    try:
        async for event in job.events():
            if isinstance(event, Failed):
                raise failure(event.error)
            yield event
    finally:
        job.cancel()  # a no-op once finished; stops the generation when the client has gone


def _sse(chunks: AsyncIterator[dict]) -> StreamingResponse:
    async def lines() -> AsyncIterator[str]:
        try:
            async for chunk in chunks:
                yield f"data: {json.dumps(chunk)}\n\n"
        except ApiError as exc:  # the status line is sent: report it in the stream, as OpenAI does
            error = openai_error(exc.status, exc.message, exc.param, exc.code)
            yield f"data: {json.dumps({'error': error | ({'type': 'server_error'} if exc.status >= 500 else {})})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(lines(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
