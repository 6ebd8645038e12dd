"""Framing (protocol/framing.py): each API's stream, and an error raised after the status line reported in
the stream as that API reports it. No model: the chunks come from a plain generator."""

import asyncio
import json

import pytest

from ollama_spec.server.protocol.errors import ApiError
from ollama_spec.server.protocol.framing import ndjson, sse, sse_events


async def _failing(*chunks):
    for chunk in chunks:
        yield chunk
    raise ApiError(503, "the server is shutting down")


def _body(response) -> str:
    async def read():
        return "".join([part async for part in response.body_iterator])

    return asyncio.run(read())


def test_sse_reports_the_error_as_openai_does_then_done():
    lines = _body(sse(_failing({"a": 1}))).split("\n\n")
    assert json.loads(lines[0][6:]) == {"a": 1}
    error = json.loads(lines[1][6:])["error"]
    assert error["type"] == "server_error" and error["message"] == "the server is shutting down"
    assert lines[2] == "data: [DONE]"


def test_response_events_are_numbered_and_an_error_is_an_error_event():
    events = _body(sse_events(_failing({"type": "response.created"}))).strip().split("\n\n")
    assert events[0].startswith("event: response.created\n")
    assert json.loads(events[0].split("data: ")[1])["sequence_number"] == 0
    name, data = events[1].split("\n")
    assert name == "event: error"
    assert json.loads(data[6:]) == {
        "type": "error",
        "code": None,
        "message": "the server is shutting down",
        "param": None,
        "sequence_number": 1,
    }


@pytest.mark.parametrize("chunks", [({"done": True},), ()])
def test_ndjson_is_one_object_a_line_and_an_error_as_ollama_sends_it(chunks):
    lines = _body(ndjson(_failing(*chunks))).splitlines()
    assert [json.loads(line) for line in lines] == [*chunks, {"error": "the server is shutting down"}]
