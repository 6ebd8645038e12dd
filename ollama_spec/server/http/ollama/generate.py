"""Ollama's generation routes: /api/chat and /api/generate (NDJSON streaming by default), and the answer
to the routes not served here. (/api/tags, /api/show, /api/ps: models.py; pull, delete, copy: manage.py.)"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import replace

from fastapi import APIRouter
from fastapi import Request as HTTPRequest

from ollama_spec.engine.engine import Result
from ollama_spec.errors import InvalidSetting
from ollama_spec.prompting.messages import ToolCall
from ollama_spec.server.http.ollama import go_template
from ollama_spec.server.http.parsed import ParsedRoute
from ollama_spec.server.protocol.answer import AnswerParts, answer_parts
from ollama_spec.server.protocol.draft_spans import result_marks, spans_field
from ollama_spec.server.protocol.errors import ApiError
from ollama_spec.server.protocol.framing import Last, ndjson
from ollama_spec.server.protocol.logprobs import scored
from ollama_spec.server.protocol.ollama import (
    ChatRequest,
    GenerateRequest,
    InferenceRequest,
    Options,
    final,
    finished,
    now,
)
from ollama_spec.server.protocol.stream import Part, answer_stream, run_to_end
from ollama_spec.server.serving.loaded import Served
from ollama_spec.server.serving.request import Asked
from ollama_spec.server.serving.state import ServerState
from ollama_spec.server.serving.worker import Job

router = APIRouter(route_class=ParsedRoute)

MANAGEMENT = ("create", "push", "blobs")  # Ollama's routes that change its store and are not served here


@router.post("/api/chat")
async def chat(body: ChatRequest, http_request: HTTPRequest):
    state: ServerState = http_request.app.state.server
    if not body.messages:  # Ollama's way to load a model (or with keep_alive 0 to unload it)
        return final(body.model, {"message": {"role": "assistant", "content": ""}}, await _load(state, body))
    if any(m.images for m in body.messages):
        raise ApiError(400, "images are not supported: the loaded models read text only")
    options = Options.from_map(body.options).asked()
    asked = Asked(
        messages=[m.to_chat() for m in body.messages],
        grammar=body.grammar(),
        tools=body.tools or [],
        logprobs=body.logprob_count,
        think=body.thinks,
        truncate=body.truncate,
        show_draft=body.show_draft,
        **options,
    )
    # a larger num_ctx, or a prompt that needs one, may reload the model
    served, request = await state.prepare(body.model, body.keep_alive, options["n_ctx"], asked)
    job = served.submit(request, "/api/chat")

    def piece(text: str, thought: str = "", calls: list[ToolCall] = ()) -> dict:
        message = {"role": "assistant", "content": text} | ({"thinking": thought} if thought else {})
        if calls:  # ids as Ollama gives them, for clients that answer a call by its id
            message["tool_calls"] = [
                {
                    "id": f"call_{uuid.uuid4().hex[:8]}",
                    "function": {"index": i, "name": c.name, "arguments": c.arguments},
                }
                for i, c in enumerate(calls)
            ]
        return {"message": message}

    if body.stream:
        return ndjson(_chunks(served, body, job, answer_parts(served.engine, request), piece))
    result = await run_to_end(job, http_request)
    thought, text, calls, drafted = answer_parts(served.engine, request).whole_marked(result.text, result_marks(result))
    fields = piece(text, thought, calls) | spans_field(body.show_draft, drafted) | _logprobs(served, body, result)
    return _finished(served, body, fields, result)


@router.post("/api/generate")
async def generate(body: GenerateRequest, http_request: HTTPRequest):
    state: ServerState = http_request.app.state.server
    if body.raw and (body.template or body.system or body.context):
        raise ApiError(400, "raw mode does not support template, system, or context")  # Ollama's words
    if not body.prompt:  # Ollama's way to load a model (or with keep_alive 0 to unload it)
        return final(body.model, {"response": ""}, await _load(state, body))
    if body.images:
        raise ApiError(400, "images are not supported: the loaded models read text only")
    if body.template and body.suffix:
        raise ApiError(400, "give template or suffix, not both: a suffix is laid out with the model's own tokens")
    options = Options.from_map(body.options).asked()
    asked = Asked(
        prompt=body.prompt,
        system=body.system,
        raw=body.raw or bool(body.template),
        grammar=body.grammar(),
        context=body.context or (),
        logprobs=body.logprob_count,
        think=body.thinks,
        suffix=body.suffix or None,
        truncate=body.truncate,
        show_draft=body.show_draft,
        **options,
    )
    served, request = await state.prepare(  # a larger num_ctx, or a prompt that needs one, may reload the model
        body.model,
        body.keep_alive,
        options["n_ctx"],
        asked,
        lambda served, asked: replace(asked, tokens=_templated(served, body)),  # a template's tokens are the pair's
    )
    job = served.submit(request, "/api/generate")
    prompt = request.tokens

    def piece(text: str, thought: str = "", calls: list[ToolCall] = ()) -> dict:
        return {"response": text} | ({"thinking": thought} if thought else {})

    def ending(result: Result) -> dict:  # the tokens a next request may send back as its context (not raw's)
        return {} if body.raw else {"context": [*prompt, *result.tokens]}

    if body.stream:
        return ndjson(_chunks(served, body, job, answer_parts(served.engine, request), piece, ending))
    result = await run_to_end(job, http_request)
    thought, text, _, drafted = answer_parts(served.engine, request).whole_marked(result.text, result_marks(result))
    fields = piece(text, thought) | spans_field(body.show_draft, drafted) | ending(result)
    return _finished(served, body, fields | _logprobs(served, body, result), result)


async def _load(state: ServerState, body: InferenceRequest) -> str:
    """A request with nothing to generate: load the model ("load"), or with keep_alive 0 unload it
    ("unload"), as Ollama answers both. A pinned pair is never unloaded."""
    if body.load_reason == "unload":
        await state.canonical(body.model)  # an unknown model is a 404, loaded or not
        await state.unload(body.model)  # a pinned pair stays
        return "unload"
    await state.acquire(body.model, body.keep_alive, Options.from_map(body.options).as_llama_cpp_reads().num_ctx)
    return "load"


def _templated(state: Served, body: GenerateRequest) -> list[int]:
    """The prompt through the request's own template, as tokens; none without one."""
    if not body.template:
        return []
    system = body.system if body.system is not None else state.engine.target_model.system
    try:
        text = go_template.render(body.template, prompt=body.prompt, system=system or "")
    except InvalidSetting as exc:
        raise ApiError(400, str(exc), "template") from None
    if not text:  # no prompt to continue: never fall back to the model's own template unasked
        raise ApiError(400, "the template renders an empty prompt", "template")
    return state.engine.templated_tokens(text)


def _logprobs(state: Served, body: InferenceRequest, result: Result) -> dict:
    return {"logprobs": scored(state.engine.target, result.scored)} if body.logprobs else {}


def _finished(state: Served, body: InferenceRequest, fields: dict, result: Result) -> dict:
    return finished(body.model, fields, result, state.summary(result))


@router.api_route("/api/{action:path}", methods=["POST", "DELETE", "HEAD"], include_in_schema=False)
async def unsupported(action: str):
    """Last of the routes, so that it answers only what no other route does (with --upstream, the daemon
    answers these instead: http/forwarding.py). Ollama's create, push and blobs stay Ollama's."""
    if action.split("/")[0] not in MANAGEMENT:
        raise ApiError(404, "Not Found")
    raise ApiError(
        501,
        f"/api/{action.split('/')[0]} is not supported by ollama-spec serve; use Ollama itself "
        "(ollama create, ollama push), or start serve with --upstream URL to pass it on to a running Ollama",
    )


async def _chunks(
    state: Served,
    body: InferenceRequest,
    job: Job,
    parts: AnswerParts,
    piece: Callable[..., dict],
    ending: Callable[[Result], dict] = lambda result: {},
) -> AsyncIterator[dict | Last]:
    """The NDJSON objects: text pieces (with their tokens' logprobs when asked; a thinking model's
    thinking apart; with `show_draft`, the draft's characters of each piece's content as
    `draft_spans`; tool calls, when the answer was one, as Ollama sends them: in a piece of their
    own), then the final object with the counts."""

    def chunk(fields: dict, part: Part) -> dict:
        extra = {"logprobs": scored(state.engine.target, part.scored)} if body.logprobs and part.scored else {}
        spans = spans_field(body.show_draft and bool(part.text), part.drafted)
        return {"model": body.model, "created_at": now()} | fields | extra | spans | {"done": False}

    async for part in answer_stream(job, parts, cut=False):
        if part.result is None:
            yield chunk(piece(part.text, part.thought), part)
            continue
        said = part.thought or part.text or part.calls or (body.logprobs and part.scored)
        last = [chunk(piece(part.text, part.thought, part.calls), part)] if said else []
        yield Last([*last, _finished(state, body, piece("") | ending(part.result), part.result)])  # one write
