"""A grammar's llama.cpp calls run off the generating thread, bounded: a check that takes seconds is given up
on when its request is cancelled or when it runs past the bound, and then runs to its end on its own
thread, over a vocabulary of its own that outlives the model."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from ollama_spec.engine.engine import Engine
from ollama_spec.errors import Stopped
from ollama_spec.llama import grammar_calls
from ollama_spec.llama.grammar import Grammar
from ollama_spec.llama.grammar_calls import GrammarTooSlow
from tests.conftest import engine_settings

# One check of this grammar takes seconds over the tiny vocabulary: llama.cpp advances each token through a
# parse stack per prefix of optional items, deduplicating them pairwise (cubic in the items).
SLOW = "root ::= " + " ".join(['"a"?'] * 250)


def _grammar_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "ollama-spec-grammar"]


def _until_no_grammar_thread_runs(seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while _grammar_threads():
        assert time.monotonic() < deadline, "a grammar check given up on never ended"
        time.sleep(0.1)


def test_a_cancelled_request_stops_waiting_for_its_grammar(spec_engine):
    cancelled = threading.Event()
    grammar = Grammar.for_model(spec_engine.target, SLOW, stop=cancelled.is_set)
    threading.Timer(0.2, cancelled.set).start()
    with pytest.raises(Stopped):
        grammar.mask(np.zeros(spec_engine.target.n_vocab, dtype=np.float32))
    with pytest.raises(Stopped):  # the check still runs: every later call fails at once
        grammar.copy()
    grammar.close()
    _until_no_grammar_thread_runs()


def test_a_check_past_the_bound_is_an_error_that_names_the_grammar(spec_engine, monkeypatch):
    monkeypatch.setattr(grammar_calls, "GRAMMAR_CALL_SECONDS", 0.1)
    grammar = Grammar.for_model(spec_engine.target, SLOW)
    with pytest.raises(GrammarTooSlow, match=r"the output grammar took more than 0\.1 s to check one token"):
        grammar.mask(np.zeros(spec_engine.target.n_vocab, dtype=np.float32))
    grammar.close()
    _until_no_grammar_thread_runs()


def test_a_check_given_up_on_outlives_its_model(tiny_models):
    """The model is freed while the check runs on: the check reads a vocabulary of its own, and frees it
    when it ends (a check over the model's would read freed memory and take the process down)."""
    engine = Engine(tiny_models[0], None, engine_settings())
    cancelled = threading.Event()
    grammar = Grammar.for_model(engine.target, SLOW, stop=cancelled.is_set)
    threading.Timer(0.2, cancelled.set).start()
    with pytest.raises(Stopped):
        grammar.mask(np.zeros(engine.target.n_vocab, dtype=np.float32))
    grammar.close()
    engine.close()
    assert _grammar_threads()  # still checking, after the model is gone
    _until_no_grammar_thread_runs()


def test_a_plain_grammar_answers_as_llama_cpp_does_and_its_thread_ends(spec_engine):
    grammar = Grammar.for_model(spec_engine.target, 'root ::= "yes" | "no"')
    copy = grammar.copy()
    allowed = np.isfinite(grammar.mask(np.zeros(spec_engine.target.n_vocab, dtype=np.float32)))
    tokens = [int(t) for t in np.flatnonzero(allowed)]
    pieces = [spec_engine.target.token_piece(t)[0] for t in tokens]
    assert pieces and all(b"yes".startswith(p) or b"no".startswith(p) for p in pieces), pieces
    copy.accept(tokens[0])
    copy.close()
    grammar.close()
    _until_no_grammar_thread_runs(30)
