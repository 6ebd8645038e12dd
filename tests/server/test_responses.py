"""OpenAI's Responses API (/v1/responses) through the official client, as OpenAI's docs lead with it."""

from typing import Literal

import pytest
from openai import BadRequestError, OpenAI
from pydantic import BaseModel

from tests.serving import serving_tiny_pair


@pytest.fixture(scope="module")
def server(tiny_models):
    with serving_tiny_pair(tiny_models) as served:
        yield served


@pytest.fixture
def client(server):
    return OpenAI(base_url=server[0] + "/v1", api_key="anything")


def test_create_as_the_docs_show(client):
    response = client.responses.create(
        model="gpt-5", input="Write a one-sentence bedtime story about a unicorn.", max_output_tokens=30, temperature=0
    )
    assert response.object == "response" and response.output_text
    assert response.status in ("completed", "incomplete")
    assert response.usage.output_tokens <= 30 and response.usage.input_tokens > 5
    chat = client.chat.completions.create(
        model="gpt-5",
        max_tokens=30,
        temperature=0,
        messages=[{"role": "user", "content": "Write a one-sentence bedtime story about a unicorn."}],
    )
    assert response.output_text == chat.choices[0].message.content  # the same request, the same greedy answer


def test_instructions_and_message_input(client):
    response = client.responses.create(
        model="m",
        instructions="Talk like a pirate.",
        max_output_tokens=10,
        temperature=0,
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Are semicolons optional?"}]}],
    )
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 10


def test_stream_events_in_order(client):
    events = list(client.responses.create(model="m", input="Hello", max_output_tokens=12, temperature=0, stream=True))
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-4].text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


class Answer(BaseModel):
    ok: bool
    colour: Literal["red", "green", "blue"]


def test_stream_helper_and_parse_with_a_text_format(client):
    """A schema's grammar ends the tiny model's answer, so the stream completes."""
    with client.responses.stream(model="m", input="Hello", temperature=0, text_format=Answer) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.output_text == "".join(texts) and final.status == "completed"
    assert isinstance(final.output_parsed, Answer)
    parsed = client.responses.parse(model="m", input="Is the sky blue?", text_format=Answer, temperature=0)
    assert isinstance(parsed.output_parsed, Answer)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id is not supported"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
            "input_image is not supported",
        ),
        (
            {"input": [{"type": "item_reference", "id": "msg_1"}]},
            "input items of type 'item_reference' are not supported",
        ),
        ({"tools": [{"type": "web_search"}]}, "only function tools are supported"),
        ({"max_output_tokens": 0}, "max_output_tokens must be at least 1"),
    ],
)
def test_what_is_refused(client, fields, message):
    with pytest.raises(BadRequestError, match=message):
        client.responses.create(**({"model": "m", "input": "Hi"} | fields))


def test_an_earlier_output_goes_back_in_as_input(client):
    """OpenAI's multi-turn pattern, input += response.output: a thinking model's reasoning items are
    taken (and left out, as templates leave earlier thinking out), a function's output may be parts."""
    turn = [
        {"role": "user", "content": "What is the weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hm"}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "c1", "output": [{"type": "input_text", "text": "22 C"}]},
    ]
    answer = client.responses.create(model="m", input=turn, max_output_tokens=4, temperature=0)
    assert answer.status in ("completed", "incomplete")


def test_a_forced_call_cut_by_max_output_tokens_is_an_incomplete_function_call(client):
    """Not its JSON as output text: a function_call item, "incomplete", its arguments as far as written."""
    tool = {
        "type": "function",
        "name": "add",
        "parameters": {
            "type": "object",
            "required": ["a", "b"],
            "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
        },
    }
    for max_output_tokens in range(4, 40):
        answer = client.responses.create(
            model="m",
            input="2 + 3?",
            tools=[tool],
            tool_choice="required",
            max_output_tokens=max_output_tokens,
            temperature=0,
        )
        calls = [item for item in answer.output if item.type == "function_call"]
        if calls and calls[0].arguments:
            break
    assert answer.status == "incomplete" and answer.output_text == ""
    assert calls[0].name == "add" and calls[0].status == "incomplete" and calls[0].arguments.startswith("{")
    events = list(
        client.responses.create(
            model="m",
            input="2 + 3?",
            tools=[tool],
            tool_choice="required",
            max_output_tokens=max_output_tokens,
            temperature=0,
            stream=True,
        )
    )
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert [e.arguments for e in done] == [calls[0].arguments] and events[-1].type == "response.incomplete"
