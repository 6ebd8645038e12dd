"""Tool calling over both APIs with the official clients: the tools go into the chat template, a
forced call (tool_choice) is kept to by a grammar, and calls come back as each API shapes them."""

import dataclasses
import json

import httpx
import ollama
import pytest
from openai import BadRequestError, OpenAI

from ollama_spec.engine.engine import Engine, Request
from ollama_spec.prompting.messages import ChatMessage, ToolCall
from tests.conftest import engine_settings
from tests.grammars import CONTROL
from tests.serving import running_server, serving_tiny_pair

# A Hermes/Qwen-style template: the tools in a system turn, earlier calls as <tool_call> blocks.
TOOLS_TEMPLATE = (
    "{{- bos_token }}{%- if tools %}<|start_header_id|>system<|end_header_id|>\n\nTools:\n"
    "{%- for t in tools %}{{ t | tojson }}\n{%- endfor %}<|eot_id|>{%- endif %}"
    "{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{%- if m.tool_calls %}{%- for c in m.tool_calls %}<tool_call>{{ {'name': c.function.name, "
    "'arguments': c.function.arguments} | tojson }}</tool_call>{%- endfor %}"
    "{%- else %}{{ m.content }}{%- endif %}<|eot_id|>{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}"
)
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "required": ["city"],
            "properties": {"city": {"enum": ["Paris", "Oslo"]}, "unit": {"enum": ["C", "F"]}},
        },
    },
}
ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two numbers",
        "parameters": {
            "type": "object",
            "required": ["a", "b"],
            "properties": {
                "a": {"type": "integer", "maximum": 99, "minimum": 0},
                "b": {"type": "integer", "maximum": 99, "minimum": 0},
            },
        },
    },
}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tiny_models):
    target = tiny_models[0]
    target = dataclasses.replace(target, info=dataclasses.replace(target.info, chat_template=TOOLS_TEMPLATE))
    with Engine(target, tiny_models[1], engine_settings()) as engine, running_server(engine) as served:
        yield served


@pytest.fixture
def client(server):
    return OpenAI(base_url=server[0] + "/v1", api_key="anything")


def test_the_tools_reach_the_chat_template(server):
    engine = server[1].serving.served.engine
    request = Request(messages=(), prompt="Hi", tools=(WEATHER,))
    prompt = engine.target.detokenize(engine.prompt_tokens(request), special=True)
    assert '"name": "get_weather"' in prompt and "The weather in a city" in prompt


def test_a_required_call_as_the_openai_docs_show(client):
    response = client.chat.completions.create(
        model="gpt-4o", messages=USER, tools=[WEATHER, ADD], tool_choice="required", temperature=0
    )
    choice = response.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name in ("get_weather", "add")
    arguments = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert arguments["city"] in ("Paris", "Oslo")
    else:
        assert set(arguments) >= {"a", "b"}


def test_a_named_call_streamed_and_the_answer_sent_back(client):
    stream = client.chat.completions.create(
        model="m",
        messages=USER,
        tools=[WEATHER, ADD],
        stream=True,
        tool_choice={"type": "function", "function": {"name": "add"}},
    )
    chunks = list(stream)
    calls = [c for chunk in chunks if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
    assert calls[0].function.name == "add" and {c.index for c in calls} == {0}  # one call, in pieces
    assert not "".join(chunk.choices[0].delta.content or "" for chunk in chunks if chunk.choices)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    arguments = json.loads("".join(c.function.arguments for c in calls))
    history = USER + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": calls[0].id, "type": "function", "function": {"name": "add", "arguments": json.dumps(arguments)}}
            ],
        },
        {"role": "tool", "tool_call_id": calls[0].id, "content": str(arguments["a"] + arguments["b"])},
    ]
    answer = client.chat.completions.create(
        model="m", messages=history, tools=[WEATHER, ADD], max_tokens=10, temperature=0
    )
    assert answer.choices[0].finish_reason in ("length", "stop", "tool_calls")


def test_a_forced_call_to_a_pydantic_tool_with_nested_models(client):
    """pydantic writes nested models and enums as $defs and $refs (instructor, pydantic-ai and litellm
    send such tools): the forced call's grammar must still resolve them."""
    from enum import Enum

    from pydantic import BaseModel, Field

    class Colour(str, Enum):
        red = "red"
        blue = "blue"

    class Item(BaseModel):  # no free text: the random tiny model would write a string until max_tokens
        colour: Colour
        count: int

    class Order(BaseModel):
        items: list[Item] = Field(max_length=2)

    tool = {"type": "function", "function": {"name": "order", "parameters": Order.model_json_schema()}}
    response = client.chat.completions.create(
        model="m",
        messages=USER,
        tools=[tool, ADD],
        temperature=0,
        max_tokens=300,
        tool_choice={"type": "function", "function": {"name": "order"}},
    )
    assert response.choices[0].message.tool_calls, response.choices[0]
    call = response.choices[0].message.tool_calls[0]
    order = Order.model_validate_json(call.function.arguments)  # the nested shape, enum values included
    assert call.function.name == "order" and isinstance(order.items, list)


def test_a_call_cut_by_max_tokens_comes_back_as_a_cut_call(client):
    """As OpenAI returns it: in tool_calls, with the arguments as far as they were written, and finish
    reason "length", so that clients report an invalid call instead of taking the JSON for an answer."""
    forced = {"type": "function", "function": {"name": "add"}}
    whole = client.chat.completions.create(
        model="m", messages=USER, tools=[WEATHER, ADD], tool_choice=forced, max_tokens=40, temperature=0
    )
    full = whole.choices[0].message.tool_calls[0].function.arguments

    def cut(max_tokens):
        return client.chat.completions.create(
            model="m", messages=USER, tools=[WEATHER, ADD], tool_choice=forced, max_tokens=max_tokens, temperature=0
        )

    def begun(message):  # the call's name whole and some of its arguments written
        return bool(message.tool_calls) and message.tool_calls[0].function.arguments not in ("", None)

    limit = next(n for n in range(4, 40) if begun(cut(n).choices[0].message))
    response = cut(limit)
    choice = response.choices[0]
    assert choice.finish_reason == "length" and choice.message.content is None
    call = choice.message.tool_calls[0]
    assert call.function.name == "add" and full.replace(" ", "").startswith(call.function.arguments.replace(" ", ""))
    stream = list(
        client.chat.completions.create(
            model="m",
            messages=USER,
            tools=[WEATHER, ADD],
            tool_choice=forced,
            max_tokens=limit,
            temperature=0,
            stream=True,
        )
    )
    calls = [c for chunk in stream if chunk.choices for c in chunk.choices[0].delta.tool_calls or []]
    assert "".join(c.function.arguments for c in calls) == call.function.arguments
    assert stream[-1].choices[0].finish_reason == "length"


def test_sampled_string_arguments_are_json(client):
    """Temperature 1, a few seeds: a forced call's free-text arguments hold no raw control character
    (llama-cpp-python's converter let the tiny pair write them, and clients could not parse the call)."""
    note = {
        "type": "function",
        "function": {
            "name": "note",
            "parameters": {
                "type": "object",
                "required": ["title", "text"],
                "properties": {"title": {"type": "string", "maxLength": 20}, "text": {"type": "string"}},
            },
        },
    }
    for seed in range(10):
        choice = client.chat.completions.create(
            model="m", messages=USER, tools=[note], tool_choice="required", temperature=1, seed=seed, max_tokens=96
        ).choices[0]
        arguments = choice.message.tool_calls[0].function.arguments
        assert not CONTROL.search(arguments), f"seed {seed}: {arguments!r}"
        if choice.finish_reason == "tool_calls":
            assert set(json.loads(arguments)) == {"title", "text"}


def test_tool_choice_none_and_auto_text_answers(client):
    plain = client.chat.completions.create(model="m", messages=USER, max_tokens=12, temperature=0)
    none = client.chat.completions.create(
        model="m", messages=USER, tools=[WEATHER], tool_choice="none", max_tokens=12, temperature=0
    )
    assert none.choices[0].message.content == plain.choices[0].message.content  # tools not shown at all
    auto = client.chat.completions.create(model="m", messages=USER, tools=[WEATHER], max_tokens=12, temperature=0)
    message = auto.choices[0].message
    assert message.tool_calls or message.content  # the tiny model may write anything: a call or text


def test_ollama_tools_as_the_docs_show(server):
    client = ollama.Client(host=server[0])

    def add(a: int, b: int) -> int:
        """Add two numbers

        Args:
          a: The first number
          b: The second number
        """
        return a + b

    response = client.chat(
        model="llama3.1",
        messages=[{"role": "user", "content": "What is 2 plus 3?"}],
        tools=[add, WEATHER],
        options={"temperature": 0, "num_predict": 40},
    )
    assert response.message.role == "assistant"
    assert response.message.tool_calls is None or response.message.tool_calls[0].function.name in ("add", "get_weather")
    follow_up = client.chat(
        model="llama3.1",
        tools=[add],
        options={"num_predict": 5},
        messages=[
            {"role": "user", "content": "What is 2 plus 3?"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [{"function": {"name": "add", "arguments": {"a": 2, "b": 3}}}],
            },
            {"role": "tool", "content": "5", "tool_name": "add"},
        ],
    )
    assert follow_up.done


def test_ollama_reads_calls_the_model_writes(server, monkeypatch):
    """The model's own text is parsed: here a grammar (format) makes the tiny model write a call."""
    call_schema = {
        "type": "object",
        "required": ["name", "arguments"],
        "properties": {"name": {"const": "add"}, "arguments": ADD["function"]["parameters"]},
    }
    body = {
        "model": "m",
        "messages": USER,
        "tools": [ADD],
        "format": call_schema,
        "stream": False,
        "options": {"temperature": 0},
    }
    answer = httpx.post(server[0] + "/api/chat", json=body, timeout=60).json()
    calls = answer["message"]["tool_calls"]
    assert calls[0]["function"]["name"] == "add" and set(calls[0]["function"]["arguments"]) >= {"a", "b"}
    assert answer["message"]["content"] == ""
    streamed = [
        json.loads(line)
        for line in httpx.post(server[0] + "/api/chat", json=body | {"stream": True}, timeout=60).text.splitlines()
    ]
    streamed_calls = next(s for s in streamed if s["message"].get("tool_calls"))["message"]["tool_calls"]
    assert all(call.pop("id").startswith("call_") for call in calls + streamed_calls)  # Ollama gives each an id
    assert streamed_calls == calls
    assert all(not s["message"]["content"] for s in streamed)


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"tool_choice": {"type": "function", "function": {"name": "fly"}}}, "not among the tools offered"),
        ({"tool_choice": "required", "response_format": {"type": "json_object"}}, "cannot be combined"),
        ({"tools": [{"type": "function"}]}, "each tool must be"),
    ],
)
def test_bad_tool_requests(client, fields, message):
    with pytest.raises(BadRequestError, match=message):
        client.chat.completions.create(**({"model": "m", "messages": USER, "tools": [ADD], "max_tokens": 4} | fields))


def test_a_call_whose_arguments_are_not_json_goes_back_as_its_text(client, server):
    """A call cut by max_tokens, or a model's broken JSON: the client sends it back with an answer
    saying so, and the template reads the text (as transformers passes it)."""
    history = USER + [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b'}}],
        },
        {"role": "tool", "tool_call_id": "1", "content": "the arguments were cut short"},
    ]
    answer = client.chat.completions.create(model="m", messages=history, tools=[ADD], max_tokens=4, temperature=0)
    assert answer.choices[0].finish_reason in ("length", "stop", "tool_calls")
    engine = server[1].serving.served.engine
    prompt = engine.target.detokenize(
        engine.prompt_tokens(
            Request(
                messages=(
                    ChatMessage("user", "2 + ?"),
                    ChatMessage("assistant", "", (ToolCall("add", '{"a": 2, "b'),)),
                    ChatMessage("tool", "cut"),
                ),
                tools=(ADD,),
            )
        ),
        special=True,
    )
    assert json.dumps('{"a": 2, "b') in prompt  # this template writes arguments with tojson: the text, quoted


def test_a_template_without_tools_gets_them_in_the_system_message(tiny_models):
    """SmolLM2's and other templates have no place for tools: they are described in the system
    message, earlier calls written as the JSON asked for, answers as user turns."""
    with serving_tiny_pair(tiny_models) as (url, state):
        client = OpenAI(base_url=url + "/v1", api_key="x")
        response = client.chat.completions.create(
            model="m", messages=USER, tools=[ADD], tool_choice="required", temperature=0
        )
        call = response.choices[0].message.tool_calls[0]
        assert call.function.name == "add" and response.choices[0].finish_reason == "tool_calls"
        history = (
            ChatMessage("user", "2 + 3?"),
            ChatMessage("assistant", "", (ToolCall("add", {"a": 2, "b": 3}),)),
            ChatMessage("tool", "5"),
        )
        engine = state.serving.served.engine
        prompt = engine.target.detokenize(engine.prompt_tokens(Request(messages=history, tools=(ADD,))), special=True)
        assert "You can call these tools" in prompt and '"name": "add"' in prompt
        assert '{"name": "add", "arguments": {"a": 2, "b": 3}}' in prompt and "The tool add answered: 5" in prompt


def test_show_lists_tools_among_the_capabilities(server, tiny_models):
    assert "tools" in ollama.Client(host=server[0]).show("m").capabilities
    with serving_tiny_pair(tiny_models) as (url, _):  # a template without tools: described in the system message
        # never "embedding" beside "completion": Ollama's `ollama run` would embed instead of chat
        assert ollama.Client(host=url).show("m").capabilities == ["completion", "tools"]


FLAT_WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": WEATHER["function"]["parameters"],
}


def test_responses_function_calling_as_the_openai_docs_show(client):
    """Calls come back as function_call items; their outputs go back in as input items."""
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    response = client.responses.create(
        model="gpt-5", input=question, tools=[FLAT_WEATHER], tool_choice="required", temperature=0
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert response.status == "completed" and len(calls) == 1 and response.output_text == ""
    assert calls[0].name == "get_weather" and json.loads(calls[0].arguments)["city"] in ("Paris", "Oslo")
    follow_up = question + [
        calls[0].model_dump(exclude={"status", "id"}),
        {"type": "function_call_output", "call_id": calls[0].call_id, "output": "22 C"},
    ]
    answer = client.responses.create(
        model="gpt-5", input=follow_up, tools=[FLAT_WEATHER], max_output_tokens=8, temperature=0
    )
    assert answer.usage.input_tokens > response.usage.input_tokens
    events = list(
        client.responses.create(
            model="gpt-5",
            input=question,
            tools=[FLAT_WEATHER],
            stream=True,
            tool_choice={"type": "function", "name": "get_weather"},
            temperature=0,
        )
    )
    types = [e.type for e in events]
    assert "response.output_text.delta" not in types and types[-1] == "response.completed"
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and json.loads(done[0].arguments) == json.loads(calls[0].arguments)
    assert events[-1].response.output[0].type == "function_call"
