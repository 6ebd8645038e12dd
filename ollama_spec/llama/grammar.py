"""Structured output: the JSON a client asks for (Ollama's `format`, OpenAI's `response_format`, a
GBNF grammar) as a llama.cpp grammar that masks the target's choices token by token.

The grammar constrains the target's distribution: the output is what the target alone would
write under the same grammar (greedy: the best allowed token; sampling: the target's distribution
over the allowed tokens). The draft drafts under a copy of the grammar, so its proposals stay
acceptable; its copy is thrown away after each step.

This is a second narrow seam to llama.cpp (beside `model`): llama.cpp's grammar sampler, which
parses GBNF and knows which token texts a grammar state allows. `Grammar` is what decoding/grammar's
TokenGrammar asks for; the loop sees nothing else of it.
"""

from __future__ import annotations

import ctypes
import json
from collections.abc import Callable
from functools import partial
from typing import Any

import llama_cpp
import numpy as np

from ollama_spec.errors import InvalidSetting
from ollama_spec.llama.grammar_calls import GrammarCalls, grammar_vocab
from ollama_spec.llama.grammar_limits import check_gbnf, check_schema
from ollama_spec.llama.json_schema import JSON_OBJECT_GBNF, json_schema_to_gbnf
from ollama_spec.llama.log import last_error, log_mark
from ollama_spec.llama.sequences import SequenceView

# llama_token_data, as numpy sees it: the whole vocabulary is handed to the grammar in one call.
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)], align=True)


def grammar_for_json(schema: Any = None) -> str:
    """GBNF for a JSON object (`schema` None, as Ollama's `format: "json"` and OpenAI's `json_object`
    mean), or for JSON matching `schema` (a JSON Schema, as a dict)."""
    if schema is None:
        return JSON_OBJECT_GBNF
    if not isinstance(schema, dict):
        raise InvalidSetting(f"a JSON schema must be an object, got {json.dumps(schema)[:80]}")
    check_schema(schema)
    try:
        return json_schema_to_gbnf(schema)
    except Exception as exc:  # noqa: BLE001 - the converter raises bare errors (KeyError, ValueError, ...) on schemas it cannot do
        raise InvalidSetting(f"cannot constrain the output to this JSON schema: {type(exc).__name__}: {exc}") from None


def new_grammar_sampler(vocab: Any, gbnf: str) -> Any:
    """llama.cpp's grammar sampler for `gbnf` over `vocab`; InvalidSetting with llama.cpp's reason when
    it cannot parse the grammar, or with the bound it passed (grammar_limits) before llama.cpp sees it."""
    check_gbnf(gbnf)
    mark = log_mark()
    sampler = llama_cpp.llama_sampler_init_grammar(vocab, gbnf.encode("utf-8"), b"root")
    if not sampler:
        raise InvalidSetting(f"the output grammar is not valid GBNF: {last_error(mark) or 'llama.cpp refused it'}")
    return sampler


class Grammar:
    """A llama.cpp grammar over a model's vocabulary, in the state after the tokens it has accepted.

    Its llama.cpp calls run on `calls` (grammar_calls.GrammarCalls, shared with its copies): one check
    may take minutes for some grammars, and the generation must be able to stop waiting for it."""

    def __init__(
        self,
        vocab: Any,
        gbnf: str | None = None,
        *,
        calls: GrammarCalls | None = None,
        _sampler: Any = None,
        _owner: Any = None,
        _owns_calls: bool | None = None,
    ):
        self._vocab, self._sampler, self._owner = vocab, None, _owner  # _owner: what keeps `vocab` alive
        # a copy shares its original's calls, which end with it
        self._owns_calls = _sampler is None if _owns_calls is None else _owns_calls
        self._calls = calls if calls is not None else GrammarCalls()
        self._sampler = _sampler if _sampler is not None else new_grammar_sampler(vocab, gbnf)

    @classmethod
    def for_model(cls, model: Any, gbnf: str, stop: Callable[[], bool] | None = None) -> Grammar:
        """The grammar over a loaded model's vocabulary (model.LoadedModel, or a sequence of one), read from
        a vocabulary of its own (grammar_calls.grammar_vocab), so that a check still running after its
        request ended never reads a model that was unloaded. `stop`: whether the request was cancelled."""
        owner = grammar_vocab(model.model if isinstance(model, SequenceView) else model)
        return cls(owner.vocab, gbnf, calls=GrammarCalls(stop), _owner=owner)

    def started(self, stop: Callable[[], bool] | None = None) -> Grammar:
        """A grammar in this one's state with calls of its own (`stop`: whether its request was cancelled), for
        one generation: a grammar compiled once, when its request was checked, is started by each generation
        that follows it, and never advanced itself."""
        sampler = llama_cpp.llama_sampler_clone(self._sampler)  # a copy of the parsed rules: no second parse
        return Grammar(self._vocab, calls=GrammarCalls(stop), _sampler=sampler, _owner=self._owner, _owns_calls=True)

    def copy(self) -> Grammar:
        """An independent copy in the same state (the draft drafts under one)."""
        sampler = self._calls.call(partial(llama_cpp.llama_sampler_clone, self._sampler))
        return Grammar(self._vocab, calls=self._calls, _sampler=sampler, _owner=self._owner)

    def allows(self, token: int) -> bool:
        data = np.zeros(1, dtype=_TOKEN_DATA)
        data["id"] = token
        self._apply(data)
        return bool(np.isfinite(data["logit"][0]))

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of one row of logits with -inf wherever the grammar forbids the token."""
        data = np.zeros(logits.size, dtype=_TOKEN_DATA)
        data["id"] = np.arange(logits.size, dtype=np.int32)
        data["logit"] = logits
        self._apply(data)
        return data["logit"].copy()

    def best(self, logits: np.ndarray) -> int | None:
        """The highest-scoring allowed token (None: the grammar allows nothing here).

        Masking a whole row costs milliseconds at a 128k vocabulary; the row's own best token is
        almost always allowed, and then one check is enough."""
        token = int(logits.argmax())
        if self.allows(token):
            return token
        masked = self.mask(logits)
        token = int(masked.argmax())
        return token if np.isfinite(masked[token]) else None

    def accept(self, token: int) -> None:
        """Advance past `token`, which must be allowed (llama.cpp aborts on a forbidden one)."""
        self._calls.call(partial(llama_cpp.llama_sampler_accept, self._sampler, token))

    def close(self) -> None:
        """Free the sampler once no call uses it any more (the copies' calls end with the grammar's own)."""
        sampler, owner, self._sampler = self._sampler, self._owner, None
        if sampler:
            self._calls.later(partial(_free, sampler, owner))
        if self._owns_calls:
            self._calls.end()

    def __del__(self) -> None:
        self.close()

    def _apply(self, data: np.ndarray) -> None:
        array = llama_cpp.llama_token_data_array(
            data=data.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data)),
            size=data.size,
            selected=-1,
            sorted=False,
        )
        # `data` and `array` stay alive with the call, which may outlive this frame
        self._calls.call(partial(_apply, self._sampler, data, array))


def _apply(sampler: Any, data: np.ndarray, array: Any) -> None:
    llama_cpp.llama_sampler_apply(sampler, ctypes.byref(array))


def _free(sampler: Any, owner: Any) -> None:
    """Free `sampler`; `owner` (its vocabulary's) is held until then."""
    llama_cpp.llama_sampler_free(sampler)
