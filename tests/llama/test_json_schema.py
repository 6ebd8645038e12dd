"""JSON Schema grammars hold only JSON in their strings: what llama.cpp's grammar sampler accepts from
them, read over the tiny target's vocabulary."""

import json

import pytest

from ollama_spec.errors import InvalidSetting
from ollama_spec.llama.grammar import grammar_for_json
from tests.grammars import matches

# Escapes a JSON string may hold (\n \" \\ \u0041 \t \b \f \r, a surrogate pair), the raw characters it
# may not, and escapes it may not (a lone surrogate: pydantic and serde_json refuse it).
ESCAPED = r'"a\n\"\\\u0041\t\b\f\r\ud83d\ude00 z"'
RAW = ['"a\x01"', '"\x1f"', '"a\nb"', '"\tb"', '"\x1bb"']
BAD_ESCAPES = [r'"a\x41"', r'"\u004"', r'"a\"', r'"\ud800"', r'"\ude00"', r'"\ud83d\u0041"']

# Schema shapes, each with a document that holds one string where "@" stands.
SHAPES = [
    (None, '{"a": @}'),  # Ollama's format "json", OpenAI's json_object
    ({"type": "string"}, "@"),
    ({"type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}, '{"name": @}'),
    (
        {"type": "object", "required": ["name"], "properties": {"name": {"type": "string", "maxLength": 30}}},
        '{"name": @}',
    ),
    ({"type": "object", "additionalProperties": {"type": "string"}}, '{"key": @}'),
    ({"type": "object", "additionalProperties": {"type": "integer"}}, "{@: 1}"),
    (
        {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["tags"],
                "properties": {"tags": {"type": "array", "items": {"type": "string"}}},
            },
        },
        '[{"tags": ["x", @]}]',
    ),
    ({"type": "object"}, '{"free": [{"deep": @}]}'),
    ({}, '{"any": @}'),
    ({"anyOf": [{"type": "string"}, {"type": "null"}]}, "@"),
    ({"type": ["string", "null"]}, "@"),
    (
        {
            "$defs": {"t": {"type": "string"}},
            "type": "object",
            "required": ["x"],
            "properties": {"x": {"$ref": "#/$defs/t"}},
        },
        '{"x": @}',
    ),
]


@pytest.mark.parametrize("schema, document", SHAPES, ids=lambda v: json.dumps(v)[:60])
def test_strings_take_escapes_and_refuse_raw_control_characters(spec_engine, schema, document):
    gbnf = grammar_for_json(schema)
    assert matches(spec_engine, gbnf, document.replace("@", ESCAPED))
    json.loads(document.replace("@", ESCAPED))  # the accepted text is JSON
    for string in RAW + BAD_ESCAPES:
        assert not matches(spec_engine, gbnf, document.replace("@", string)), repr(string)


def test_enum_and_const_strings_are_written_as_json(spec_engine):
    """The converter turned the JSON escapes of an enum's strings into raw characters (`"a\\nb"` became a
    line break, `C:\\dir` an invalid `\\d` escape)."""
    values = ["a\nb", "C:\\dir", 'q"uote', "\x01", "é"]
    gbnf = grammar_for_json({"enum": values})
    for value in values:
        assert matches(spec_engine, gbnf, json.dumps(value)), value
    assert not matches(spec_engine, gbnf, '"a\nb"')
    const = {"k\n": ["v\\", None]}
    assert matches(spec_engine, grammar_for_json({"const": const}), json.dumps(const))
    keyed = grammar_for_json(
        {"type": "object", "required": ['say "hi"\n'], "properties": {'say "hi"\n': {"type": "integer"}}}
    )
    assert matches(spec_engine, keyed, r'{"say \"hi\"\n": 1}')


@pytest.mark.parametrize(
    "pattern, accepted, refused",
    [
        # the dot: anything but a line break, written as JSON
        ("^a.b$", [r'"a-b"', r'"a\"b"', r'"a\\b"', r'"a\tb"', '"aéb"'], ['"a\x01b"', '"a\nb"', r'"a\nb"', '"a"b"']),
        # a negated class: what it leaves in, written as JSON
        ("^[^,]+$", [r'"x\"y"', r'"x\\y"', r'"tab\t"'], ['"x,y"', '"x\x1fy"', '"x\\y"', '""']),
        # a class naming characters JSON must escape
        ('^["\\\\a-c]{2}$', [r'"\"a"', r'"\\c"'], ['"""', '"\\a"', '"ad"']),
        ("^[\\x00-\\x7f]$", [r'"\n"', '"~"'], ['"\x07"', '"é"']),
        # literals: a quote and a backslash in the pattern
        ('^say "hi"\\\\$', [r'"say \"hi\"\\"'], ['"say "hi"\\"', r'"say \"hi\""']),
        # escaped punctuation, which GBNF itself has no escape for
        ("^v[0-9]\\.[0-9\\-]+$", ['"v1.2-3"'], ['"v1x2"']),
    ],
)
def test_patterns_keep_their_meaning_in_json(spec_engine, pattern, accepted, refused):
    gbnf = grammar_for_json({"type": "string", "pattern": pattern})
    for text in accepted:
        assert matches(spec_engine, gbnf, text), text
    for text in refused:
        assert not matches(spec_engine, gbnf, text), text


def test_patterns_it_cannot_write_as_json_are_refused():
    with pytest.raises(InvalidSetting, match=r"unsupported escape \\d"):
        grammar_for_json({"type": "string", "pattern": "^\\d+$"})
    with pytest.raises(InvalidSetting, match="only characters a JSON string must escape"):
        grammar_for_json({"type": "string", "pattern": "^[\\x01-\\x02]$"})
