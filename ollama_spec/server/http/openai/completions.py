"""OpenAI's text completions: /v1/completions (SSE when streaming), with the older logprobs shape."""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter
from fastapi import Request as HTTPRequest

from ollama_spec.server.http.parsed import ParsedRoute
from ollama_spec.server.protocol.draft_spans import joined, result_marks, spans_field
from ollama_spec.server.protocol.errors import ApiError
from ollama_spec.server.protocol.framing import sse
from ollama_spec.server.protocol.logprobs import LegacyLogprobs, scored
from ollama_spec.server.protocol.openai import MAX_CHOICES, CompletionRequest, copies, each_input, one_stream, run_all
from ollama_spec.server.protocol.openai_answers import answers, chunks
from ollama_spec.server.serving.loaded import Served
from ollama_spec.server.serving.request import Asked
from ollama_spec.server.serving.state import ServerState

router = APIRouter(prefix="/v1", route_class=ParsedRoute)

COMPLETIONS_MAX_TOKENS = 16  # /v1/completions without max_tokens, as OpenAI's reference gives it


@router.post("/completions")
async def completions(body: CompletionRequest, http_request: HTTPRequest):
    state: ServerState = http_request.app.state.server
    prompts = _prompts(body)
    asked = [
        Asked(
            prompt=prompt if isinstance(prompt, str) else "",
            tokens=() if isinstance(prompt, str) else prompt,
            raw=True,
            max_tokens=body.max_tokens,
            logprobs=body.logprobs,
            suffix=body.suffix or None,
            default_max_tokens=COMPLETIONS_MAX_TOKENS,
            show_draft=body.show_draft,
            **body.sampling(),
        )
        for prompt in prompts
    ]
    # a prompt longer than the loaded context may reload the model
    served, requests = await state.prepare_each(body.model, None, None, asked, _in_vocabulary)
    target = served.engine.target
    prompts = [p if isinstance(p, str) else target.detokenize(p, special=True) for p in prompts]  # for echo
    meta = {"id": f"cmpl-{uuid.uuid4().hex}", "created": int(time.time()), "model": served.model_name}
    meta["object"] = "text_completion"

    def scores():  # one choice's logprobs: its text offsets are counted across its chunks
        legacy = LegacyLogprobs()
        return (
            None
            if body.logprobs is None
            else lambda tokens: legacy(scored(target, tokens), [not target.token_piece(t.id)[1] for t in tokens])
        )

    if body.stream:
        one_stream(len(requests) * body.n)
        job = served.submit(requests[0], "/v1/completions")
        echo = _text(prompts[0]) | spans_field(body.show_draft, ())  # the prompt: none of it drafted
        opening = {"index": 0, **echo, "finish_reason": None} if body.echo else None
        return sse(
            chunks(served, job, meta, _text, body.include_usage, opening, scores=scores(), show_draft=body.show_draft)
        )
    runs = [copy for request in requests for copy in copies(request, body.n)]  # prompt by prompt, as OpenAI orders
    results = await run_all(served, http_request, runs, "/v1/completions")
    echoed = [prompt if body.echo else "" for prompt in prompts for _ in range(body.n)]
    choices = [
        (
            _text(echo + r.text)
            | {"logprobs": score(r.scored) if (score := scores()) else None}
            | spans_field(body.show_draft, joined((False,) * len(echo), result_marks(r))),
            None,
        )
        for echo, r in zip(echoed, results)
    ]
    return answers(served, meta, choices, results, body.n)


def _prompts(body: CompletionRequest) -> list[str | list[int]]:
    """The prompts asked for, each a text or token ids, checked before the model loads."""
    prompts = each_input(body.prompt)
    if not prompts or any(not prompt for prompt in prompts if not isinstance(prompt, str)):
        raise ApiError(400, "prompt is empty: give a text, a list of texts, or token ids", "prompt")
    if len(prompts) * body.n > MAX_CHOICES:
        raise ApiError(400, f"{len(prompts)} prompts times n={body.n} is more than {MAX_CHOICES} completions", "n")
    body.check()
    if body.suffix and any(not isinstance(prompt, str) for prompt in prompts):
        raise ApiError(
            400, "suffix needs the prompt as text: the gap is laid out with the model's own tokens", "suffix"
        )
    return prompts


def _in_vocabulary(served: Served, asked: Asked) -> Asked:
    """`asked`, whose prompt's token ids must be the loaded model's own."""
    n_vocab = served.engine.target.n_vocab
    if any(not 0 <= token < n_vocab for token in asked.tokens):
        raise ApiError(400, f"token ids must be in 0..{n_vocab - 1} (this model's own vocabulary)", "prompt")
    return asked


def _text(text: str) -> dict:
    return {"text": text, "logprobs": None}
