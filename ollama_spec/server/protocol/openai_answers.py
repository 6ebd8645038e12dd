"""OpenAI's answers and chunks for the completion routes: choices, usage, llama-server's timings and the
speculation field, streamed through the one driver (protocol/stream.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator, Callable

from ollama_spec.engine.engine import Result
from ollama_spec.prompting.messages import ToolCall
from ollama_spec.prompting.tools import CallPiece
from ollama_spec.server.protocol.answer import AnswerParts
from ollama_spec.server.protocol.draft_spans import Marks, spans_field
from ollama_spec.server.protocol.framing import Last
from ollama_spec.server.protocol.stream import answer_stream
from ollama_spec.server.serving.loaded import Served
from ollama_spec.server.serving.worker import Job

# Our finish reasons in OpenAI's words: a full context is a length limit too. A cancelled generation
# never reaches a client as finished: it ends with an error (see worker.py).
FINISH_REASONS = {"stop": "stop", "length": "length", "context": "length"}


def reasoning(thought: str) -> dict:
    """A thinking model's thinking, under the names clients read it by (Ollama's and DeepSeek's)."""
    return {"reasoning": thought, "reasoning_content": thought} if thought else {}


def tool_calls(calls: list[ToolCall], streamed: bool = False) -> list[dict]:
    return [
        {
            **({"index": i} if streamed else {}),
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {
                "name": call.name,
                "arguments": call.cut_arguments if call.cut_arguments is not None else json.dumps(call.arguments),
            },
        }
        for i, call in enumerate(calls)
    ]


def calls_finish(calls: list[ToolCall], result: Result) -> str | None:
    """ "tool_calls" for an answer that called; a call cut by max_tokens keeps "length", as OpenAI's does
    (None: the result's own reason)."""
    return "tool_calls" if calls and result.finish_reason != "length" else None


def answers(
    state: Served, meta: dict, choices: list[tuple[dict, str | None]], results: list[Result], n: int = 1
) -> dict:
    """Several choices in one answer (n per prompt): usage counts each prompt once and every completion."""
    counted = usage(results[0])
    counted["prompt_tokens"] = sum(r.prompt_tokens for r in results[::n])
    counted["completion_tokens"] = sum(len(r.tokens) for r in results)
    counted["total_tokens"] = counted["prompt_tokens"] + counted["completion_tokens"]
    counted["completion_tokens_details"] = {
        name: sum(usage(r)["completion_tokens_details"][name] for r in results)
        for name in counted["completion_tokens_details"]
    }
    return meta | {
        "choices": [
            {"index": i, **choice, "finish_reason": finish or FINISH_REASONS[r.finish_reason]}
            for i, ((choice, finish), r) in enumerate(zip(choices, results))
        ],
        "usage": counted,
        "speculation": state.summary(results[0]),
        "timings": timings(results[0]),
    }


def usage(result: Result) -> dict:
    """OpenAI's usage: the prompt's cached tokens, and the draft's tokens as its predicted outputs
    (accepted: kept in the answer; rejected: drafted for it and replaced), where front-ends look."""
    spec = result.speculation
    return {
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": len(result.tokens),
        "total_tokens": result.prompt_tokens + len(result.tokens),
        "prompt_tokens_details": {"cached_tokens": spec.prompt_cached},
        "completion_tokens_details": {
            "accepted_prediction_tokens": spec.accepted,
            "rejected_prediction_tokens": spec.drafted - spec.accepted,
        },
    }


def timings(result: Result) -> dict:
    """llama-server's `timings`, which Open WebUI merges into the usage it shows: the prompt's rate
    over the tokens evaluated (prompt_n), the cached ones apart (cache_n), and the draft's counts."""
    spec = result.speculation
    prompt_ms, predicted_ms = (
        1000 * result.first_token_seconds,
        1000 * (result.total_seconds - result.first_token_seconds),
    )
    evaluated, generated = result.prompt_tokens - spec.prompt_cached, len(result.tokens)
    return {
        "cache_n": spec.prompt_cached,
        "prompt_n": evaluated,
        "prompt_ms": round(prompt_ms, 3),
        "prompt_per_second": round(1000 * evaluated / prompt_ms, 2) if prompt_ms > 0 else 0.0,
        "predicted_n": generated,
        "predicted_ms": round(predicted_ms, 3),
        "predicted_per_second": round(result.tokens_per_second, 2),
        "draft_n": spec.drafted,
        "draft_n_accepted": spec.accepted,
    }


async def chunks(
    state: Served,
    job: Job,
    meta: dict,
    choice: Callable[[str], dict],
    include_usage: bool,
    opening: dict | None = None,
    parts: AnswerParts | None = None,
    scores: Callable[[tuple], dict] | None = None,
    show_draft: bool = False,
) -> AsyncIterator[dict | Last]:
    """The streamed chunks: text pieces (with their tokens' logprobs when asked; a thinking model's
    thinking as `reasoning`; with `show_draft`, the draft's characters of each piece's content as
    `draft_spans`; tool calls, when the answer was one), the finish reason with the speculation
    field, then usage if asked."""
    if include_usage:  # as OpenAI: every chunk has the key, null but in the last
        meta = meta | {"usage": None}

    def piece(thought: str, text: str, scored: tuple, drafted: Marks | None) -> dict:
        body = choice(text) | spans_field(show_draft and bool(text), drafted)
        if thought:
            body["delta"] = body.get("delta", {}) | reasoning(thought)
        extra = {"logprobs": scores(scored)} if scores and scored else {}
        return meta | {"choices": [{"index": 0, **body, **extra, "finish_reason": None}]}

    def call_piece(call: CallPiece) -> dict:  # a forced call's name (with its id) first, then its arguments
        head = {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function"} if call.name is not None else {}
        function = {"name": call.name} if call.name is not None else {}
        delta = {"tool_calls": [{"index": 0, **head, "function": function | {"arguments": call.arguments}}]}
        return meta | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]}

    if opening:
        yield meta | {"choices": [opening]}
    streamed_call = False
    async for part in answer_stream(job, parts or AnswerParts()):
        result, out = part.result, []
        if part.thought or part.text or (result is not None and part.scored):
            out.append(piece(part.thought, part.text, part.scored, part.drafted))
        for call in part.call_pieces:
            streamed_call = True
            out.append(call_piece(call))
        if result is None:
            for chunk in out:
                yield chunk
            continue
        if part.calls and not streamed_call:  # a call read from the answer's text: whole, at its end
            delta = {"delta": {"tool_calls": tool_calls(part.calls, streamed=True)}}
            out.append(meta | {"choices": [{"index": 0, **delta, "finish_reason": None}]})
        final = answers(state, meta, [(choice(""), calls_finish(part.calls, result))], [result])
        del final["usage"]  # usage comes in a chunk of its own, when asked for
        out.append(final | ({"usage": None} if include_usage else {}))
        if include_usage:
            out.append(meta | {"choices": [], "usage": usage(result)})
        yield Last(out)  # the answer's end: one write
