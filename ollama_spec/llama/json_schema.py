"""A JSON Schema as GBNF whose strings are JSON strings: llama-cpp-python's converter, corrected.

The converter (`llama_cpp.llama_grammar.json_schema_to_gbnf`) lets a string hold what no JSON parser
reads: its `char` rule allows raw control characters (U+0000-U+001F) and lone surrogate escapes, its
literals (`const`, `enum`, property names) turn a JSON escape such as `\\n` into the raw character,
and a `pattern`'s dot and character classes allow raw controls, quotes and backslashes. This converter
is the same one with those three places replaced; everything else (rule names, layout, the rest of the
grammar) is its own.
"""

from __future__ import annotations

import json
import re

from llama_cpp.llama_grammar import JSON_GBNF, BuiltinRule, SchemaConverter

_HEX = "[0-9a-fA-F]"
# \uXXXX: a code point outside the surrogates, or a high surrogate and then its low one (pydantic, which
# OpenAI's `parse` reads answers with, and serde_json refuse a lone one).
UNICODE_ESCAPE = (
    f'"u" ([0-9a-cA-CefEF] {_HEX} {_HEX} {_HEX} | [dD] [0-7] {_HEX} {_HEX}'
    f' | [dD] [89abAB] {_HEX} {_HEX} "\\\\u" [dD] [c-fC-F] {_HEX} {_HEX})'
)
# llama.cpp's own fix (common/json-schema-to-grammar.cpp), with the `\/` escape JSON also has.
CHAR_RULE = r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | ' + UNICODE_ESCAPE + ")"
# Any JSON object (Ollama's format "json", OpenAI's json_object): llama-cpp-python's, surrogates paired.
JSON_OBJECT_GBNF = JSON_GBNF.replace('"u" [0-9a-fA-F]{4}', f"({UNICODE_ESCAPE})")

# What a JSON string may not hold raw (RFC 8259, section 7), and the short escapes of those that have one.
_MUST_ESCAPE = ((0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C))
_SHORT_ESCAPES = {0x22: '"', 0x5C: "\\", 0x08: "b", 0x0C: "f", 0x0A: "n", 0x0D: "r", 0x09: "t"}
# GBNF's escapes inside a literal or a character class (llama-grammar.cpp, parse_char).
_GBNF_ESCAPES = {"t": "\t", "r": "\r", "n": "\n", "\\": "\\", '"': '"', "[": "[", "]": "]"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}
_PLAIN_IN_CLASS = re.compile(r"[A-Za-z0-9 !#$%&'()*+,./:;<=>?@_`{|}~]")


def json_schema_to_gbnf(schema: dict) -> str:
    """GBNF for the JSON values `schema` describes, every string in them valid JSON.

    Raises what the converter raises on a schema it cannot do (ValueError, KeyError, AssertionError, ...)."""
    converter = _Converter(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    schema = json.loads(json.dumps(schema))  # a copy: resolving the references rewrites them
    converter.visit(converter.resolve_refs(schema, "stdin"), "")
    return converter.format_grammar()


def gbnf_literal(text: str) -> str:
    """`text` as a GBNF literal that matches exactly it (the converter's own leaves backslashes be, so
    the JSON `"a\\nb"` of a `const` became a raw line break)."""
    return '"' + "".join(_literal_char(c) for c in text) + '"'


class _Converter(SchemaConverter):
    _pattern_rule: str | None = None  # while a pattern is converted: the name of its outer rule

    def _format_literal(self, literal: str) -> str:
        return gbnf_literal(literal)

    def _add_primitive(self, name: str, rule: BuiltinRule) -> str:
        return super()._add_primitive(name, BuiltinRule(CHAR_RULE) if name == "char" else rule)

    def _visit_pattern(self, pattern: str, name: str) -> str:
        self._pattern_rule = name
        try:
            return super()._visit_pattern(pattern, name)
        finally:
            self._pattern_rule = None

    def _add_rule(self, name: str, rule: str) -> str:
        # A pattern's rules describe the string's characters, decoded; here they become its JSON text.
        # The converter adds each piece of a pattern in exactly one rule, so none is rewritten twice.
        if self._pattern_rule is not None:
            quote, end = '"\\"" ', ' "\\"" space'
            if name != self._pattern_rule:  # one of its sub-rules (a repeated group, the dot)
                rule = _encoded(rule)
            elif rule.startswith(quote) and rule.endswith(end):  # the string, between its quotes
                rule = quote + _encoded(rule[len(quote) : -len(end)]) + end
            else:
                raise ValueError(f"unexpected rule for a pattern from llama-cpp-python's converter: {rule}")
        return super()._add_rule(name, rule)


def _encoded(body: str) -> str:
    """A GBNF rule body over a string's characters as the same over their JSON text: each literal and
    each character class becomes what JSON writes for it; rule names and operators stay."""
    out, i = [], 0
    while i < len(body):
        if body[i] in '"[':
            close = '"' if body[i] == '"' else "]"
            j = i + 1
            while j < len(body) and body[j] != close:
                j += 2 if body[j] == "\\" else 1
            if j >= len(body):
                raise ValueError(f"unterminated {body[i]} in the grammar of a pattern: {body}")
            inner = body[i + 1 : j]
            out.append(_encoded_literal(inner) if close == '"' else _encoded_class(inner))
            i = j + 1
        else:
            out.append(body[i])
            i += 1
    return "".join(out)


def _encoded_literal(inner: str) -> str:
    text = "".join(chr(c) for c, _ in _parse_chars(inner))
    return gbnf_literal(json.dumps(text, ensure_ascii=False)[1:-1])


def _encoded_class(inner: str) -> str:
    """A character class as JSON writes its characters: the ones JSON must escape leave the class, and
    those with a short escape (\\" \\\\ \\b \\f \\n \\r \\t) come back as it. Controls without one are
    left out: the string can still match the pattern, only not with those."""
    negated = inner.startswith("^")
    ranges = _parse_ranges(inner[1:] if negated else inner)

    def member(code: int) -> bool:
        return any(lo <= code <= hi for lo, hi in ranges) != negated

    escapes = "".join(letter for code, letter in _SHORT_ESCAPES.items() if member(code))
    if negated:
        plain = "[^" + _class_body(ranges + list(_MUST_ESCAPE)) + "]"
    else:
        kept = _without(ranges, _MUST_ESCAPE)
        plain = "[" + _class_body(kept) + "]" if kept else ""
    alternatives = [plain] if plain else []
    if escapes:
        alternatives.append('"\\\\" [' + _class_body([(ord(c), ord(c)) for c in escapes]) + "]")
    if not alternatives:
        raise ValueError(f"the pattern's class [{inner}] holds only characters a JSON string must escape")
    return alternatives[0] if len(alternatives) == 1 else "(" + " | ".join(alternatives) + ")"


def _parse_chars(text: str) -> list[tuple[int, bool]]:
    """The characters of a GBNF literal's or class's inside, each with whether it was escaped."""
    chars, i = [], 0
    while i < len(text):
        if text[i] != "\\":
            chars.append((ord(text[i]), False))
            i += 1
            continue
        e = text[i + 1 : i + 2]
        if e in _HEX_DIGITS:
            digits = text[i + 2 : i + 2 + _HEX_DIGITS[e]]
            if len(digits) != _HEX_DIGITS[e] or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(f"bad escape \\{e}{digits} in a pattern")
            chars.append((int(digits, 16), True))
            i += 2 + len(digits)
        elif e in _GBNF_ESCAPES:
            chars.append((ord(_GBNF_ESCAPES[e]), True))
            i += 2
        elif e and not e.isalnum():  # a regular expression's escaped punctuation (\. \- \/): the character
            chars.append((ord(e), True))
            i += 2
        else:  # \d \w \s ...: GBNF has no such classes
            raise ValueError(f"unsupported escape \\{e} in a pattern")
    return chars


def _parse_ranges(inner: str) -> list[tuple[int, int]]:
    chars, ranges, i = _parse_chars(inner), [], 0
    while i < len(chars):
        if i + 2 < len(chars) and chars[i + 1] == (ord("-"), False):  # a-z; a trailing - is itself
            ranges.append((chars[i][0], chars[i + 2][0]))
            i += 3
        else:
            ranges.append((chars[i][0], chars[i][0]))
            i += 1
    return ranges


def _without(ranges: list[tuple[int, int]], cuts: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    for cut_lo, cut_hi in cuts:
        kept = []
        for lo, hi in ranges:
            if hi < cut_lo or lo > cut_hi:
                kept.append((lo, hi))
                continue
            if lo < cut_lo:
                kept.append((lo, cut_lo - 1))
            if hi > cut_hi:
                kept.append((cut_hi + 1, hi))
        ranges = kept
    return ranges


def _class_body(ranges: list[tuple[int, int]]) -> str:
    return "".join(_class_char(lo) + ("" if lo == hi else "-" + _class_char(hi)) for lo, hi in ranges)


def _class_char(code: int) -> str:
    c = chr(code)
    if _PLAIN_IN_CLASS.fullmatch(c):
        return c
    return f"\\x{code:02X}" if code < 0x100 else f"\\u{code:04X}" if code < 0x10000 else f"\\U{code:08X}"


def _literal_char(c: str) -> str:
    if c in '\\"':
        return "\\" + c
    if c in "\n\r\t":
        return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}[c]
    return f"\\x{ord(c):02X}" if ord(c) < 0x20 or ord(c) == 0x7F else c
