"""A forced tool call streamed as OpenAI streams one: its name first, then its arguments in pieces as
they are generated (instructor's create_partial and the openai client's stream helper read them as
they grow), through the openai client."""

import dataclasses
import json

import pytest
from openai import OpenAI

from ollama_spec.engine.engine import Engine
from tests.conftest import engine_settings
from tests.server.test_tools import ADD, FLAT_WEATHER, TOOLS_TEMPLATE, USER, WEATHER
from tests.serving import running_server


@pytest.fixture(scope="module")
def client(tiny_models):
    target = tiny_models[0]
    target = dataclasses.replace(target, info=dataclasses.replace(target.info, chat_template=TOOLS_TEMPLATE))
    with Engine(target, tiny_models[1], engine_settings()) as engine, running_server(engine) as (url, _):
        yield OpenAI(base_url=url + "/v1", api_key="x")


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "add"}}])
def test_a_forced_call_streams_its_arguments_in_pieces(client, choice):
    asked = {"model": "m", "messages": USER, "tools": [WEATHER, ADD], "tool_choice": choice, "temperature": 0}
    whole = client.chat.completions.create(**asked).choices[0].message.tool_calls[0]
    chunks = list(client.chat.completions.create(**asked, stream=True))
    deltas = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
    assert len(deltas) > 2  # the name, then the arguments piece by piece
    first, rest = deltas[0], deltas[1:]
    assert first.id.startswith("call_") and first.type == "function" and first.function.name == whole.function.name
    assert all(d.index == 0 and d.id is None and d.function.name is None and d.function.arguments for d in rest)
    arguments = "".join(d.function.arguments or "" for d in deltas)
    assert json.loads(arguments) == json.loads(whole.function.arguments)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)


def test_the_openai_stream_helper_sees_the_arguments_grow(client):
    """openai's chat.completions.stream parses the arguments as they come (as instructor's
    create_partial does): more than one partial before the call is done."""
    with client.chat.completions.stream(
        model="m", messages=USER, tools=[WEATHER, ADD], tool_choice="required", temperature=0
    ) as stream:
        events = list(stream)
        final = stream.get_final_completion()
    partial = [e.arguments for e in events if e.type == "tool_calls.function.arguments.delta"]
    assert len(partial) > 1 and len(set(partial)) == len(partial)  # each one longer than the last
    done = next(e for e in events if e.type == "tool_calls.function.arguments.done")
    assert json.loads(done.arguments) == json.loads(final.choices[0].message.tool_calls[0].function.arguments)


def test_a_forced_function_call_streams_its_arguments_on_the_responses_api(client):
    flat_add = {"type": "function", "name": "add", "parameters": ADD["function"]["parameters"]}
    asked = {"model": "gpt-5", "input": USER, "tools": [FLAT_WEATHER, flat_add], "temperature": 0}
    whole = next(
        i for i in client.responses.create(**asked, tool_choice="required").output if i.type == "function_call"
    )
    events = list(client.responses.create(**asked, tool_choice="required", stream=True))
    added = next(e for e in events if e.type == "response.output_item.added")
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert added.item.name == whole.name and added.item.arguments == "" and len(deltas) > 1
    assert all(d.item_id == added.item.id for d in deltas)
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert done.arguments == "".join(d.delta for d in deltas)
    assert json.loads(done.arguments) == json.loads(whole.arguments)
    final = events[-1].response
    assert events[-1].type == "response.completed" and final.output[0].id == added.item.id
    assert final.output[0].call_id == added.item.call_id and final.output[0].arguments == done.arguments
