"""What an output grammar or a JSON schema may ask for, checked before llama.cpp sees it.

llama.cpp parses a GBNF grammar and walks its rules with the C stack: a grammar whose groups nest some
thousands deep, or whose rules refer to each other in a chain of some thousands, overflows the stack
of the thread that builds or samples it, and the whole process dies with it. A JSON schema reaches it
through a converter that writes each `maxLength`, `maxItems` or pattern count `{0,N}` as N groups
nested in each other, so one number in a request body is enough. These bounds keep every grammar far
inside what a 2 MiB thread stack holds (checked: groups nested 3,000 deep and chains of 5,000 rules),
and far above what real schemas and grammars use (Open WebUI's 36 tools as one forced call: 44 KB of
grammar in 436 rules and 161 groups). A grammar past a bound is refused with the bound it passed.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from ollama_spec.errors import InvalidSetting

MAX_GRAMMAR_BYTES = 512 * 1024
MAX_GRAMMAR_NESTING = 1024  # groups inside groups within one rule
MAX_GRAMMAR_RULES = 4096  # named rules and groups, each a rule to llama.cpp
# A repetition count: a GBNF {m,n}, a schema's length or count, a pattern's {m,n}. The converter nests
# one group per unit, and llama.cpp refuses a repeated group past about 1,000 units on its own.
MAX_REPETITION = 1000

# The schema keywords whose number becomes that many nested groups (or repeated units) of grammar.
_COUNTED = ("minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties", "minContains",
            "maxContains")  # fmt: skip
_PATTERN_COUNT = re.compile(r"(?<!\\)\{\s*(\d+)\s*(?:,\s*(\d*)\s*)?\}")


class GrammarTooLarge(InvalidSetting):
    """A grammar or schema past one of the bounds above; the message names the bound."""


def check_schema(schema: Any) -> None:
    """Refuse a JSON schema whose counts or patterns would make a grammar past the bounds."""
    for node in _schema_nodes(schema):
        for key in _COUNTED:
            value = node.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_REPETITION:
                raise GrammarTooLarge(
                    f"the JSON schema's {key} is {_number(value)}: at most {MAX_REPETITION:,} can be enforced"
                )
        pattern = node.get("pattern")
        if isinstance(pattern, str):
            for count in _pattern_counts(pattern):
                if count > MAX_REPETITION:
                    raise GrammarTooLarge(
                        f"the JSON schema's pattern repeats {count:,} times: at most {MAX_REPETITION:,} can be enforced"
                    )


def check_gbnf(gbnf: str) -> None:
    """Refuse a GBNF grammar past the bounds: its size, its groups' nesting, its rules, its repetitions."""
    size = len(gbnf.encode("utf-8", errors="replace"))
    if size > MAX_GRAMMAR_BYTES:
        raise GrammarTooLarge(f"the grammar is {size:,} bytes: at most {MAX_GRAMMAR_BYTES:,} are allowed")
    depth = rules = 0
    for token in _gbnf_tokens(gbnf):
        if token == "(":
            depth, rules = depth + 1, rules + 1
            if depth > MAX_GRAMMAR_NESTING:
                raise GrammarTooLarge(f"the grammar nests groups more than {MAX_GRAMMAR_NESTING:,} deep")
        elif token == ")":
            depth = max(depth - 1, 0)
        elif token == "::=":
            depth, rules = 0, rules + 1
        elif token.startswith("{"):
            count = max((_count(n) for n in re.findall(r"\d+", token)), default=0)
            if count > MAX_REPETITION:
                raise GrammarTooLarge(
                    f"the grammar repeats an item {count:,} times: at most {MAX_REPETITION:,} are allowed"
                )
        if rules > MAX_GRAMMAR_RULES:
            raise GrammarTooLarge(f"the grammar has more than {MAX_GRAMMAR_RULES:,} rules and groups")


def _gbnf_tokens(gbnf: str) -> Iterator[str]:
    """The grammar's structure, in order: "(", ")", "::=" and each {m,n}; literals, character classes
    and comments are skipped whole, so a parenthesis inside one counts for nothing."""
    i, n = 0, len(gbnf)
    while i < n:
        c = gbnf[i]
        if c == "#":
            end = gbnf.find("\n", i)
            i = n if end < 0 else end + 1
        elif c in '"[':
            close = '"' if c == '"' else "]"
            i += 1
            while i < n and gbnf[i] != close:
                i += 2 if gbnf[i] == "\\" else 1
            i += 1
        elif c in "()":
            yield c
            i += 1
        elif gbnf.startswith("::=", i):
            yield "::="
            i += 3
        elif c == "{":
            end = gbnf.find("}", i)
            end = n if end < 0 else end + 1
            yield gbnf[i:end]
            i = end
        else:
            i += 1


def _schema_nodes(schema: Any) -> Iterator[dict]:
    """Every object inside the schema, walked without recursion (its depth is bounded by the body's)."""
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def _pattern_counts(pattern: str) -> Iterator[int]:
    for match in _PATTERN_COUNT.finditer(pattern):
        yield max(_count(match.group(1)), _count(match.group(2) or "0"))


def _count(digits: str) -> int:
    """A count as written; one too long to read as an int (Python refuses 4,300 digits) is just huge."""
    return int(digits) if len(digits) <= 12 else 10**12


def _number(value: float) -> str:
    return f"{value:,}" if isinstance(value, int) or value.is_integer() else str(value)
