"""Reading tool calls out of a model's text, and the prompts and grammars that offer tools."""

import json

import pytest

from ollama_spec.errors import InvalidSetting
from ollama_spec.prompting.messages import ChatMessage, ToolCall
from ollama_spec.prompting.tools import (
    could_be_tool_call,
    forced_call_schema,
    parse_tool_calls,
    template_takes_tools,
    tools_in_messages,
)
from tests.grammars import matches


def forced_call_grammar(tools: list[dict], only: str | None = None) -> str:
    """The grammar the server forces a call with (server/serving/request.offer_tools)."""
    from ollama_spec.llama.grammar import grammar_for_json

    return grammar_for_json(forced_call_schema(tools, only))


NAMES = ["get_weather", "add"]


@pytest.mark.parametrize(
    "text, rest, calls",
    [
        ('{"name": "get_weather", "parameters": {"city": "Paris"}}', "", [ToolCall("get_weather", {"city": "Paris"})]),
        (
            '[{"name": "add", "arguments": {"a": 1}}, {"name": "add", "arguments": "{\\"a\\": 3}"}]',
            "",
            [ToolCall("add", {"a": 1}), ToolCall("add", {"a": 3})],
        ),  # Mistral's list; arguments as JSON text
        (
            '{"name": "add", "arguments": {}}; {"name": "get_weather", "arguments": {}}',
            "",
            [ToolCall("add", {}), ToolCall("get_weather", {})],
        ),  # Llama 3.2's ';'-separated calls
        (
            'I will look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
            "I will look.",
            [ToolCall("get_weather", {"city": "Oslo"})],
        ),
        ('{"type": "function", "function": {"name": "add", "arguments": {"a": 2}}}', "", [ToolCall("add", {"a": 2})]),
    ],
)
def test_calls_in_the_formats_templates_teach(text, rest, calls):
    assert parse_tool_calls(text, NAMES) == (rest, calls)


@pytest.mark.parametrize(
    "text",
    [
        '{"name": "fly", "arguments": {}}',  # not offered
        '{"city": "Paris"}',  # JSON, but no call
        '{"name": "add", "arguments": {}} and then some words',
        "The answer is 4.",
        '{"name": "add", "arguments": [1, 2]}',  # arguments must be an object
        '<tool_call>{"name": "add", "arguments": {}}</tool_call><tool_call>not json</tool_call>',
    ],
)
def test_anything_else_stays_text(text):
    assert parse_tool_calls(text, NAMES) == (text, [])


def test_what_may_still_be_a_call():
    for start in ("", "  ", "{", '{ "na', "[", "[{", '[ { "', "<tool", "<tool_call>{"):
        assert could_be_tool_call(start), start
    for start in ("Hi", "[here](https://x)", "{x", "{}", "[1, 2]", "<b>bold"):
        assert not could_be_tool_call(start), start


def test_a_forced_call_grammar_names_the_offered_tools():
    tools = [
        {
            "type": "function",
            "function": {
                "name": "add",
                "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
            },
        },
        {"type": "function", "function": {"name": "get_weather"}},
    ]
    assert '"add"' in forced_call_grammar(tools).replace('\\"', '"')
    only = forced_call_grammar(tools, "get_weather").replace('\\"', '"')
    assert '"get_weather"' in only and '"add"' not in only
    with pytest.raises(InvalidSetting, match="not among the tools offered"):
        forced_call_grammar(tools, "fly")
    with pytest.raises(InvalidSetting, match="each tool must be"):
        forced_call_grammar([{"type": "function"}])


def test_a_forced_call_grammar_resolves_each_tools_own_defs():
    item = {"type": "object", "properties": {"n": {"$ref": "#/$defs/Count"}}, "$defs": {"Count": {"type": "integer"}}}
    other = {
        "type": "object",
        "properties": {"n": {"$ref": "#/definitions/Count"}},
        "definitions": {"Count": {"type": "string"}},
    }  # the same name, another type: kept apart
    tools = [
        {"type": "function", "function": {"name": name, "parameters": schema}}
        for name, schema in (("a", item), ("b", other))
    ]
    grammar = forced_call_grammar(tools)  # a $ref left pointing inside the wrapper would raise here
    assert "alternative-0-arguments-n ::= integer" in grammar
    assert "alternative-1-arguments-n ::= string" in grammar


def test_a_forced_calls_string_arguments_are_json(spec_engine):
    tools = [
        {
            "type": "function",
            "function": {
                "name": "note",
                "parameters": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
            },
        },
        {"type": "function", "function": {"name": "anything"}},
    ]
    grammar = forced_call_grammar(tools)
    assert matches(spec_engine, grammar, r'{"name": "note", "arguments": {"text": "a\n\"b\"\\\u0041"}}')
    assert matches(spec_engine, grammar, r'{"name": "anything", "arguments": {"x\t": ["\u0001"]}}')
    for raw in ("a\nb", "\x01", "\x1f"):
        assert not matches(spec_engine, grammar, '{"name": "note", "arguments": {"text": "@"}}'.replace("@", raw))
        assert not matches(spec_engine, grammar, '{"name": "anything", "arguments": {"@": 1}}'.replace("@", raw))


def test_tools_described_for_a_template_without_them():
    tool = {"type": "function", "function": {"name": "add", "description": "Add two numbers"}}
    turns = tools_in_messages(
        [
            ChatMessage("system", "Be brief."),
            ChatMessage("user", "2 + 3?"),
            ChatMessage("assistant", "", (ToolCall("add", {"a": 2, "b": 3}),)),
            ChatMessage("tool", "5"),
        ],
        [tool],
    )
    assert [t.role for t in turns] == ["system", "user", "assistant", "user"]
    assert turns[0].content.startswith("Be brief.\n\nYou can call these tools:")
    assert json.dumps(tool["function"]) in turns[0].content
    assert json.loads(turns[2].content) == {"name": "add", "arguments": {"a": 2, "b": 3}}
    assert turns[3].content == "The tool add answered: 5"


def test_which_templates_take_tools():
    assert template_takes_tools("{% if tools %}{{ tools | tojson }}{% endif %}")
    assert not template_takes_tools("{{ xml_tools }}") and not template_takes_tools(None)


def test_a_recursive_tool_schema_makes_a_grammar_llama_cpp_reads(spec_engine):
    node = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
    }
    schema = {"$defs": {"Node": node, "a/b": {"type": "integer"}}, "$ref": "#/$defs/Node"}
    weird = {"type": "object", "properties": {"x": {"$ref": "#/$defs/a~1b"}}, "$defs": {"a/b": {"type": "integer"}}}
    tools = [
        {"type": "function", "function": {"name": name, "parameters": parameters}}
        for name, parameters in (("tree", schema), ("weird", weird))
    ]
    spec_engine.grammar(forced_call_grammar(tools)).close()  # llama.cpp parses it (a 400 before)


def test_a_call_cut_short_keeps_its_name_and_the_arguments_written():
    from ollama_spec.prompting.tools import cut_tool_call

    assert cut_tool_call('{"name": "add", "arguments": {"a": 1, "b', ["add"]).cut_arguments == '{"a": 1, "b'
    assert cut_tool_call('{"name":"add","arguments"', ["add"]).cut_arguments == ""
    assert cut_tool_call('{"name" : "add","ar', ["add"]).cut_arguments == ""  # cut inside the key itself
    assert cut_tool_call('{"name": "add", "x', ["add"]) is None  # another key: not a call's JSON
    assert cut_tool_call('{"name": "ad', ["add", "get_weather"]).name == "add"  # the one tool it can still be
    assert cut_tool_call('{"name": "ad', ["add", "adder"]) is None  # two: nothing to say which
    assert cut_tool_call("{", ["add"]).name == "add" and cut_tool_call("{", ["add", "get_weather"]) is None
    assert cut_tool_call('{"name": "fly", "arguments": {', ["add"]) is None  # not an offered tool
    assert cut_tool_call("Sure, here", ["add"]) is None
