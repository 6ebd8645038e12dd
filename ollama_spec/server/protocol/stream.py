"""The one streaming driver: a job's events become the answer's parts (thinking, content, tool calls),
which each API shapes into its chunks and framing.py frames; and a whole answer, waited for."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from starlette.requests import Request as HTTPRequest

from ollama_spec.decoding.loop import Token
from ollama_spec.engine.engine import Result
from ollama_spec.prompting.messages import ToolCall
from ollama_spec.prompting.tools import CallPiece
from ollama_spec.server.protocol.answer import AnswerParts
from ollama_spec.server.protocol.draft_spans import Marks, joined
from ollama_spec.server.protocol.errors import failure
from ollama_spec.server.serving.worker import Failed, Finished, Job, Piece


@dataclass(frozen=True)
class Part:
    """What of the answer goes out now: thinking, content and the tokens scored since the last part.
    The last part carries the result, and the tool calls read from the answer. `drafted`: the
    content's draft marks (show_draft; None when not asked, or not known). `call_pieces`: a forced
    call's name and arguments as they were written since the last part."""

    thought: str
    text: str
    scored: tuple[Token, ...] = ()
    calls: list[ToolCall] = field(default_factory=list)
    result: Result | None = None
    drafted: Marks | None = None
    call_pieces: tuple[CallPiece, ...] = ()


async def answer_stream(job: Job, parts: AnswerParts, cut: bool = True) -> AsyncIterator[Part]:
    """The job's answer, part by part (none while everything is held back), then the last part; a
    failure mid-stream is raised as the core's error (`failure`). `cut`: a call begun and cut short by the answer's
    length counts as a call (OpenAI's routes), not as text (Ollama's)."""
    try:
        async for event in job.events():
            if isinstance(event, Failed):
                raise failure(event.error)
            if isinstance(event, Piece):
                thought, text, drafted = parts.push_marked(event.text, event.drafted)
                pieces = tuple(parts.call_pieces())
                if thought or text or pieces:
                    yield Part(thought, text, event.scored, drafted=drafted, call_pieces=pieces)
            else:
                yield _last(event, parts, cut and event.result.finish_reason == "length")
    finally:
        job.cancel()  # a no-op once finished; stops the generation when the client has gone


def _last(end: Finished, parts: AnswerParts, cut: bool) -> Part:
    """The last part: the text that came with the end (its `piece`) and what the answer held back."""
    thought, text, drafted, scored = "", "", (), end.scored
    if end.piece is not None:
        thought, text, drafted = parts.push_marked(end.piece.text, end.piece.drafted)
        scored = end.piece.scored + scored
    pieces = parts.call_pieces()
    more_thought, rest, calls, rest_drafted = parts.finish_marked(cut=cut)
    pieces += parts.call_pieces()
    return Part(
        thought + more_thought, text + rest, scored, calls, end.result, joined(drafted, rest_drafted), tuple(pieces)
    )


async def run_to_end(job: Job, http_request: HTTPRequest) -> Result:
    """Wait for a whole (non-streamed) generation; a client that hangs up cancels it."""
    watcher = asyncio.create_task(_cancel_on_disconnect(job, http_request))
    try:
        async for event in job.events():
            if isinstance(event, Finished):
                return event.result
            if isinstance(event, Failed):
                raise failure(event.error)
    finally:
        watcher.cancel()
        job.cancel()  # a no-op once finished; stops the generation if we are being cancelled
    raise AssertionError("events end with Finished or Failed")


async def _cancel_on_disconnect(job: Job, http_request: HTTPRequest) -> None:
    while True:
        message = await http_request.receive()
        if message["type"] == "http.disconnect":
            job.cancel()
            return
