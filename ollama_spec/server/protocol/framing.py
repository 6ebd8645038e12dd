"""Framing, in one place: the chunks of a streamed answer as each API's wire carries them, and an error
that comes after the status line, reported in the stream as that API reports it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from fastapi.responses import StreamingResponse

from ollama_spec.errors import OllamaSpecError
from ollama_spec.server.protocol.errors import ApiError, api_error, ollama_error_body, openai_error

EVENT_STREAM = {"media_type": "text/event-stream", "headers": {"Cache-Control": "no-cache"}}


@dataclass(frozen=True)
class Last:
    """A stream's last chunks (an answer's last text, its finish, its usage), known at once: framed with the
    stream's end into one write. Written one by one, each write wakes the client, which on a busy machine
    takes the core from the server's event loop (a socket write wakes its reader on the writer's core) and
    gives it back for the next: the answer's end reached the client 0.5-1 ms after the last token, on a pair
    that makes a token every 0.15 ms."""

    chunks: list[dict]


Chunks = AsyncIterator[dict | Last]


def sse(chunks: Chunks) -> StreamingResponse:
    """OpenAI's chat and completions streams: `data:` lines, then `data: [DONE]`."""

    def error(exc: ApiError, _: int) -> str:
        body = openai_error(exc.status, exc.message, exc.param, exc.code)
        return f"data: {json.dumps({'error': body | ({'type': 'server_error'} if exc.status >= 500 else {})})}\n\n"

    return _framed(chunks, lambda chunk, _: f"data: {json.dumps(chunk)}\n\n", error, "data: [DONE]\n\n", **EVENT_STREAM)


def sse_events(events: Chunks) -> StreamingResponse:
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


def ndjson(chunks: Chunks) -> StreamingResponse:
    """Ollama's streams: one JSON object a line; an error as {"error": ...}, as Ollama reports it."""
    return _framed(
        chunks,
        lambda chunk, _: json.dumps(chunk) + "\n",
        lambda exc, _: json.dumps(ollama_error_body(exc.message)) + "\n",
        media_type="application/x-ndjson",
    )


def _framed(
    chunks: Chunks,
    frame: Callable[[dict, int], str],
    error: Callable[[ApiError, int], str],
    end: str = "",
    **response,
) -> StreamingResponse:
    """`frame` each chunk (with its number), a `Last` with `end` in one write; an error of the core or an
    ApiError raised meanwhile ends the stream as `error` frames it (the status line is sent), then `end`."""

    async def lines() -> AsyncIterator[str]:
        number, ended = 0, False
        try:
            async for chunk in chunks:
                if isinstance(chunk, Last):
                    yield "".join([frame(one, number + i) for i, one in enumerate(chunk.chunks)]) + end
                    number, ended = number + len(chunk.chunks), True
                else:
                    yield frame(chunk, number)
                    number += 1
        except (ApiError, OllamaSpecError) as exc:
            yield error(api_error(exc), number) + ("" if ended else end)
            return
        if end and not ended:
            yield end

    return StreamingResponse(lines(), **response)
