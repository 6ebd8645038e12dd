"""Structured output in tests: reading a grammar's language through llama.cpp's own grammar sampler
(no GBNF parser of ours), and checking sampled JSON."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, Field

# Raw in a JSON string, no parser reads it; the schema grammars' only whitespace is " ", so a sampled
# answer holds none anywhere.
CONTROL = re.compile(r"[\x00-\x1f]")


class ShortStrings(BaseModel):
    """Strings that end: the tiny pair's answers finish, so they can be parsed."""

    name: str = Field(max_length=24)
    notes: list[Annotated[str, Field(max_length=24)]] = Field(max_length=3)


class FreeStrings(BaseModel):
    """Strings that run to the token limit: more characters written, more chances of a raw one."""

    title: str
    notes: list[str]


def assert_json_strings(text: str, finished: bool, model: type[BaseModel], seed: int) -> None:
    """No raw control character in a sampled answer; a finished one is `model`'s JSON (pydantic, as
    OpenAI's `parse` reads it)."""
    assert not CONTROL.search(text), f"seed {seed}: {text!r}"
    if finished:
        model.model_validate_json(text, strict=True)


def matches(engine, gbnf: str, text: str) -> bool:
    """Does the grammar take the whole of `text`, as the engine's target spells it, and then allow the end?

    The tiny pair's vocabulary is byte-level: every text has a spelling in it."""
    grammar = engine.grammar(gbnf)
    try:
        for token in engine.target.tokenize(text, add_bos=False, special=False):
            if not grammar.allows(token):
                return False
            grammar.accept(token)
        return grammar.allows(engine.target.eos_token)
    finally:
        grammar.close()
