"""Framing, in one place: the chunks of a streamed answer as each API's wire carries them, and an error
that comes after the status line, reported in the stream as that API reports it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse

from ollama_spec.errors import OllamaSpecError
from ollama_spec.server.protocol.errors import ApiError, api_error, ollama_error_body, openai_error

EVENT_STREAM = {"media_type": "text/event-stream", "headers": {"Cache-Control": "no-cache"}}


def sse(chunks: AsyncIterator[dict]) -> StreamingResponse:
    """OpenAI's chat and completions streams: `data:` lines, then `data: [DONE]`."""

    def error(exc: ApiError, _: int) -> str:
        body = openai_error(exc.status, exc.message, exc.param, exc.code)
        return f"data: {json.dumps({'error': body | ({'type': 'server_error'} if exc.status >= 500 else {})})}\n\n"

    return _framed(chunks, lambda chunk, _: f"data: {json.dumps(chunk)}\n\n", error, "data: [DONE]\n\n", **EVENT_STREAM)


def sse_events(events: AsyncIterator[dict]) -> StreamingResponse:
    """OpenAI's Responses stream: named events, numbered in order."""

    def event(chunk: dict, number: int) -> str:
        return f"event: {chunk['type']}\ndata: {json.dumps(chunk | {'sequence_number': number})}\n\n"

    def error(exc: ApiError, number: int) -> str:
        return event(
            {
                "type": "error",
                "code": openai_error(exc.status, exc.message, exc.param, exc.code)["code"],
                "message": exc.message,
                "param": exc.param,
            },
            number,
        )

    return _framed(events, event, error, **EVENT_STREAM)


def ndjson(chunks: AsyncIterator[dict]) -> StreamingResponse:
    """Ollama's streams: one JSON object a line; an error as {"error": ...}, as Ollama reports it."""
    return _framed(
        chunks,
        lambda chunk, _: json.dumps(chunk) + "\n",
        lambda exc, _: json.dumps(ollama_error_body(exc.message)) + "\n",
        media_type="application/x-ndjson",
    )


def _framed(
    chunks: AsyncIterator[dict],
    frame: Callable[[dict, int], str],
    error: Callable[[ApiError, int], str],
    end: str = "",
    **response,
) -> StreamingResponse:
    """`frame` each chunk (with its number); an error of the core or an ApiError raised meanwhile ends the
    stream as `error` frames it (the status line is sent), then `end`."""

    async def lines() -> AsyncIterator[str]:
        number = 0
        try:
            async for chunk in chunks:
                yield frame(chunk, number)
                number += 1
        except (ApiError, OllamaSpecError) as exc:
            yield error(api_error(exc), number)
        if end:
            yield end

    return StreamingResponse(lines(), **response)
