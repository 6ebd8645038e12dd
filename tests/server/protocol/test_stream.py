"""The one streaming driver (protocol/stream.py): a job's events as the answer's parts, whatever the API.
No model: the events are put on the job by hand."""

import asyncio

import pytest

from ollama_spec.decoding.loop import Token
from ollama_spec.engine.engine import Request, Result
from ollama_spec.errors import ServerFault
from ollama_spec.prompting.messages import ToolCall
from ollama_spec.server.protocol.answer import AnswerParts
from ollama_spec.server.protocol.stream import answer_stream
from ollama_spec.server.serving.mailbox import Mailbox
from ollama_spec.server.serving.worker import Failed, Finished, Job, Piece

TOOLS = [{"type": "function", "function": {"name": "now"}}]


def _parts(events, tools=(), cut=True, together=False):
    """The parts of `events`, each put once the reader has taken the one before (`together`: all put
    before it reads, as a step's pieces come)."""

    async def run():
        loop = asyncio.get_running_loop()
        job = Job(Request(), loop, mailbox=Mailbox(loop, poll_s=0))  # each put taken at once, never by a timer

        async def feed():
            for event in events:
                job.put(event)
                for _ in range(4):  # the put, then the reader's turn
                    await asyncio.sleep(0)

        if together:
            job.put(*events)
        feeding = None if together else asyncio.create_task(feed())
        parts = [part async for part in answer_stream(job, AnswerParts(tools), cut)]
        if feeding is not None:
            await feeding
        return parts, job

    return asyncio.run(run())


def test_pieces_become_parts_and_the_last_carries_the_result():
    result = Result(text="Hello there", finish_reason="stop")
    parts, job = _parts([Piece("Hello"), Piece(" there"), Finished(result)])
    assert [(p.text, p.result) for p in parts] == [("Hello", None), (" there", None), ("", result)]
    assert job.cancelled  # the driver always lets go of the job


def test_pieces_waiting_together_are_one_part_with_their_tokens_and_marks():
    result = Result(text="Hello there", finish_reason="stop")
    scored = (Token(1, True), Token(2, False))
    events = [Piece("Hel", scored[:1], (True,) * 3), Piece("lo", scored[1:], (False,) * 2), Finished(result)]
    parts, _ = _parts(events, together=True)  # with the end: the last part, sent as one chunk
    assert [(p.text, p.scored, p.drafted, p.result) for p in parts] == [
        ("Hello", scored, (True, True, True, False, False), result)
    ]
    assert [p.text for p in _parts(events)[0]] == ["Hel", "lo", ""]  # read as they came: one part each


def test_a_pieces_draft_marks_go_with_its_content():
    drafted = [Piece("ab", drafted=(True, False)), Piece("<tool", drafted=(True,) * 5), Piece("!", drafted=(False,))]
    parts, _ = _parts([*drafted, Finished(Result(finish_reason="stop"))], TOOLS)
    # "<tool" may open a call: held, then sent with its own marks once "!" says it does not
    assert [(p.text, p.drafted) for p in parts] == [("ab", (True, False)), ("<tool!", (True,) * 5 + (False,)), ("", ())]
    assert all(p.drafted is None for p in _parts([Piece("ab"), Finished(Result())])[0])  # not asked for


def test_held_back_text_comes_as_calls_and_a_cut_call_only_where_asked():
    parts, _ = _parts([Piece('{"name": "now", "arguments": {}}'), Finished(Result(finish_reason="stop"))], TOOLS)
    assert len(parts) == 1 and parts[0].calls == [ToolCall("now", {})]
    cut = [Piece('{"name": "now", "argu'), Finished(Result(finish_reason="length"))]
    assert _parts(cut, TOOLS)[0][-1].calls[0].cut_arguments is not None
    assert _parts(cut, TOOLS, cut=False)[0][-1].calls == []


def test_a_failure_is_raised_as_the_cores_error():
    with pytest.raises(ServerFault, match="generation failed: RuntimeError: boom"):
        _parts([Piece("a"), Failed(RuntimeError("boom"))])
