"""OpenAI's model list and chat: /v1/models and /v1/chat/completions (SSE when streaming)."""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import replace

from fastapi import APIRouter
from fastapi import Request as HTTPRequest

from ollama_spec.engine.engine import Result
from ollama_spec.server.http.parsed import ParsedRoute
from ollama_spec.server.http.upstream import merge_tags, tag_name
from ollama_spec.server.protocol.answer import answer_parts
from ollama_spec.server.protocol.draft_spans import result_marks, spans_field
from ollama_spec.server.protocol.framing import sse
from ollama_spec.server.protocol.logprobs import scored
from ollama_spec.server.protocol.openai import ChatCompletionRequest, copies, one_stream, run_all, text_only
from ollama_spec.server.protocol.openai_answers import answers, calls_finish, chunks, reasoning, tool_calls
from ollama_spec.server.serving.request import Asked, think_if_able
from ollama_spec.server.serving.state import ServerState

router = APIRouter(prefix="/v1", route_class=ParsedRoute)


@router.get("/models")
async def list_models(http_request: HTTPRequest) -> dict:
    state: ServerState = http_request.app.state.server
    created = int(state.started)
    names = [name for name, _ in await asyncio.to_thread(state.listed)]
    data = [{"id": name, "object": "model", "created": created, "owned_by": "ollama-spec"} for name in names]
    if state.upstream is not None and not state.serving.answers_every_name:  # the daemon's after ours, as /api/tags
        ours = [{"name": name} for name in names]
        theirs = merge_tags(ours, await state.upstream.tags())[len(ours) :]
        data += [{"id": tag_name(m), "object": "model", "created": created, "owned_by": "ollama"} for m in theirs]
    return {"object": "list", "data": data}


@router.get("/models/{model:path}")
async def retrieve_model(model: str, http_request: HTTPRequest) -> dict:
    """One model's card: any name is answered by a pinned pair (as the completion routes do); the store's
    names otherwise."""
    state: ServerState = http_request.app.state.server
    model = await state.canonical(model)
    return {"id": model, "object": "model", "created": int(state.started), "owned_by": "ollama-spec"}


@router.post("/chat/completions")
async def chat_completions(body: ChatCompletionRequest, http_request: HTTPRequest):
    state: ServerState = http_request.app.state.server
    asked, forced = _asked(body)
    served, request = await state.prepare(  # a prompt longer than the loaded context may reload the model
        body.model,
        None,
        None,
        asked,
        lambda served, asked: replace(asked, think=think_if_able(served.engine, asked.think)),
    )
    target = served.engine.target
    scores = None if asked.logprobs is None else lambda tokens: {"content": scored(target, tokens), "refusal": None}
    meta = {"id": f"chatcmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": served.model_name}
    if body.stream:
        one_stream(body.n)
        opening = {"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}
        job = served.submit(request, "/v1/chat/completions")
        return sse(
            chunks(
                served,
                job,
                meta | {"object": "chat.completion.chunk"},
                _delta,
                body.include_usage,
                opening,
                answer_parts(served.engine, request, forced=bool(forced)),
                scores,
                body.show_draft,
            )
        )

    def choice(result: Result) -> tuple[dict, str | None]:
        thought, text, calls, drafted = answer_parts(served.engine, request).whole_marked(
            result.text, result_marks(result), cut=result.finish_reason == "length"
        )
        message = {"role": "assistant", "content": text or None if calls else text} | reasoning(thought)
        if calls:
            message["tool_calls"] = tool_calls(calls)
        answer = {"message": message, "logprobs": scores(result.scored) if scores else None}
        return answer | spans_field(body.show_draft, drafted), calls_finish(calls, result)

    results = await run_all(served, http_request, copies(request, body.n), "/v1/chat/completions")
    return answers(served, meta | {"object": "chat.completion"}, [choice(r) for r in results], results, body.n)


def _asked(body: ChatCompletionRequest) -> tuple[Asked, str | None]:
    """What the request asks, checked as far as it can be before its model loads, and the grammar of a forced
    tool call (None: none forced)."""
    text_only(body.messages)
    limit, name = (
        (body.max_completion_tokens, "max_completion_tokens")
        if body.max_completion_tokens is not None
        else (body.max_tokens, "max_tokens")
    )
    sampling = body.sampling()  # the output grammar built once: offered_tools only asks whether there is one
    tools, forced = body.offered_tools(sampling["grammar"] is not None)
    if forced:
        sampling["grammar"] = forced
    asked = Asked(
        messages=[m.to_chat() for m in body.messages],
        max_tokens=limit,
        max_tokens_name=name,
        tools=tools,
        logprobs=(body.top_logprobs or 0) if body.logprobs else None,
        think=body.think(),  # kept only for a thinking model (think_if_able, once it is loaded)
        show_draft=body.show_draft,
        **sampling,
    )
    return asked, forced


def _delta(text: str) -> dict:
    return {"delta": {"content": text} if text else {}}
