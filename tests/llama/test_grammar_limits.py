"""The bounds on a grammar or a JSON schema, checked before llama.cpp parses them (a grammar past them
overflows the C stack and ends the process)."""

import pytest

from ollama_spec.llama.grammar import grammar_for_json
from ollama_spec.llama.grammar_limits import (
    MAX_GRAMMAR_BYTES,
    MAX_GRAMMAR_NESTING,
    MAX_GRAMMAR_RULES,
    MAX_REPETITION,
    GrammarTooLarge,
    check_gbnf,
    check_schema,
)
from ollama_spec.prompting.tools import forced_call_schema
from tests.openwebui import builtin_tools


def nested(depth: int) -> str:
    return "root ::= " + "(" * depth + '"a"' + ")" * depth


def chain(rules: int) -> str:
    return "\n".join([f"r{i} ::= r{i + 1}" for i in range(rules - 1)] + [f'r{rules - 1} ::= "a"', "root ::= r0"])


@pytest.mark.parametrize(
    "schema, message",
    [
        ({"type": "string", "maxLength": 30000}, "the JSON schema's maxLength is 30,000: at most 1,000"),
        ({"type": "array", "maxItems": 100000}, "maxItems is 100,000"),
        ({"type": "string", "pattern": "^a{0,100000}$"}, "pattern repeats 100,000 times"),
        ({"type": "string", "pattern": "^(ab){5000}$"}, "pattern repeats 5,000 times"),
        ({"type": "string", "pattern": "^a{3," + "9" * 5000 + "}$"}, "pattern repeats 1,000,000,000,000 times"),
        ({"type": "string", "minLength": 1001.0}, "minLength is 1,001"),
        ({"properties": {"a": {"items": [{"type": "string", "maxLength": 2000}]}}}, "maxLength is 2,000"),
        ({"$defs": {"deep": {"type": "object", "maxProperties": 5000}}}, "maxProperties is 5,000"),
    ],
)
def test_a_schema_past_a_bound_is_refused_naming_it(schema, message):
    with pytest.raises(GrammarTooLarge, match=message.replace("(", r"\(")):
        check_schema(schema)
    with pytest.raises(GrammarTooLarge):  # before the converter writes thousands of nested groups
        grammar_for_json(schema)


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "maxLength": MAX_REPETITION},
        {"type": "array", "items": {"type": "string", "maxLength": 50}, "maxItems": 100, "minItems": 1},
        {"type": "string", "pattern": r"^\{5000\}[a-z]{2,8}$"},  # escaped braces are not a count
        {"type": "string", "description": "at most {5000} words", "maxLength": True},
        forced_call_schema(builtin_tools(), None),
    ],
)
def test_schemas_within_the_bounds_pass(schema):
    check_schema(schema)
    check_gbnf(grammar_for_json(schema))


@pytest.mark.parametrize(
    "gbnf, message",
    [
        (nested(MAX_GRAMMAR_NESTING + 1), "nests groups more than 1,024 deep"),
        (nested(20000), "nests groups more than 1,024 deep"),
        (chain(MAX_GRAMMAR_RULES + 1), "more than 4,096 rules and groups"),
        ('root ::= "a"{0,100000}', "repeats an item 100,000 times"),
        ('root ::= ("a" "b"){1001,}', "repeats an item 1,001 times"),
        ('root ::= "' + "a" * MAX_GRAMMAR_BYTES + '"', "the grammar is 524,299 bytes: at most 524,288"),
    ],
)
def test_a_grammar_past_a_bound_is_refused_naming_it(gbnf, message):
    with pytest.raises(GrammarTooLarge, match=message):
        check_gbnf(gbnf)


@pytest.mark.parametrize(
    "gbnf",
    [
        nested(MAX_GRAMMAR_NESTING),
        chain(MAX_GRAMMAR_RULES - 1),
        'root ::= "a"{0,1000} "b"{3}',
        # parentheses and braces inside literals, classes and comments are text, not structure
        'root ::= "' + "(" * 5000 + '" [({0,99999}] # ((((({0,99999}\n' + 'x ::= "\\"((("',
        'root ::= ( [a-z] | ( "b" ) )+ \n# a comment ((( \n',
    ],
)
def test_grammars_within_the_bounds_pass(gbnf):
    check_gbnf(gbnf)


def test_a_bound_refusal_is_an_invalid_setting_with_the_bound(spec_engine):
    """The engine's grammar (every face's way to one) checks before llama.cpp parses: this grammar
    ends the process when llama.cpp parses it on an 8 MiB stack."""
    with pytest.raises(GrammarTooLarge, match="nests groups more than"):
        spec_engine.grammar(nested(20000))
