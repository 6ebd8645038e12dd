"""Structured output: llama.cpp's grammar over the tiny pair's vocabulary, and the speculative loop
under it (greedy: the target alone's constrained answer; sampling: its constrained distribution)."""

import json

import numpy as np
import pytest

from ollama_spec.decoding.grammar import masked_rows
from ollama_spec.decoding.loop import SpeculationSettings, generate_tokens
from ollama_spec.decoding.sampling import SamplingSettings, logits_to_probs
from ollama_spec.engine.engine import Request
from ollama_spec.errors import InvalidSetting
from ollama_spec.llama.grammar import Grammar, grammar_for_json
from tests.distribution import assert_counts_follow
from tests.grammars import FreeStrings, ShortStrings, assert_json_strings
from tests.greedy import assert_greedy_identical

SCHEMA = {
    "type": "object",
    "required": ["ok", "n", "colour"],
    "properties": {
        "ok": {"type": "boolean"},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "colour": {"enum": ["red", "green", "blue"]},
    },
}
LETTERS = "root ::= [a-h] [a-h] [a-h] [a-h]"
GREEDY = SamplingSettings(temperature=0)


def test_json_grammars():
    assert "object" in grammar_for_json() and "root" in grammar_for_json()
    schema_grammar = grammar_for_json(SCHEMA)
    assert '"red"' in schema_grammar.replace('\\"', '"') and "boolean" in schema_grammar
    with pytest.raises(InvalidSetting, match="must be an object"):
        grammar_for_json(["not", "a", "schema"])
    with pytest.raises(InvalidSetting, match="cannot constrain the output to this JSON schema"):
        grammar_for_json({"$ref": "#/definitions/missing"})


def test_bad_gbnf_is_refused_with_a_reason(spec_engine):
    with pytest.raises(InvalidSetting, match="not valid GBNF"):
        spec_engine.grammar("root ::= undefined-rule")


def test_allows_mask_best_and_copies(spec_engine):
    target = spec_engine.target
    letter = {chr(c): target.tokenize(chr(c), add_bos=False, special=False) for c in range(ord("a"), ord("z") + 1)}
    letter = {c: ids[0] for c, ids in letter.items() if len(ids) == 1}
    grammar = spec_engine.grammar(LETTERS)
    try:
        assert grammar.allows(letter["a"]) and not grammar.allows(letter["z"])
        logits = np.zeros(target.n_vocab, dtype=np.float32)
        logits[letter["z"]] = 5.0  # the row's best is forbidden: best() finds the best allowed one
        logits[letter["c"]] = 3.0
        assert grammar.best(logits) == letter["c"]
        masked = grammar.mask(logits)
        assert np.isneginf(masked[letter["z"]]) and masked[letter["c"]] == 3.0
        copy = grammar.copy()
        copy.accept(letter["b"])  # the copy moves on; the original stays where it was
        assert grammar.allows(letter["a"])
        for c in "ccc":
            copy.accept(letter[c])
        assert not copy.allows(letter["a"]) and copy.allows(target.eos_token)  # four letters, then the end
        copy.close()
    finally:
        grammar.close()


def test_masked_rows_stop_masking_after_a_forbidden_draft(spec_engine):
    target = spec_engine.target
    a, z = (target.tokenize(c, add_bos=False, special=False)[0] for c in "az")
    grammar = spec_engine.grammar(LETTERS)
    logits = np.zeros((4, target.n_vocab), dtype=np.float32)
    logits[:, z] = 9.0
    rows = masked_rows(grammar, [a, z, a], logits, greedy=True)
    assert np.isneginf(rows[0, z]) and np.isneginf(rows[1, z])  # rows 0 and 1 are read by verification
    assert rows[2, z] == 9.0 and rows[3, z] == 9.0  # past the forbidden z nothing is read: left as they were
    assert grammar.allows(a)  # the grammar itself did not move
    grammar.close()


def _generate(engine, grammar, use_draft=True, **kwargs):
    request = Request("Describe the weather", **({"max_tokens": 60, "sampling": GREEDY, "grammar": grammar} | kwargs))
    generation = engine.generate(request, use_draft=use_draft)
    text = "".join(generation)
    return request, generation.result, text


@pytest.mark.parametrize("k", [1, 3, 8, None])
def test_greedy_json_is_the_target_alones_constrained_answer(spec_engine, k):
    grammar = grammar_for_json(SCHEMA)
    request, expected, text = _generate(spec_engine, grammar, use_draft=False)
    answer = json.loads(text)
    assert expected.finish_reason == "stop" and set(answer) == {"ok", "n", "colour"}
    assert answer["colour"] in ("red", "green", "blue") and 0 <= answer["n"] <= 99
    _, result, spec_text = _generate(spec_engine, grammar, speculation=SpeculationSettings(k))
    assert_greedy_identical(spec_engine, request, expected.tokens, result.tokens)
    # auto may find that the tiny pair's drafts do not pay on this machine (K=0 throughout): exact all the same
    assert (result.speculation.drafted > 0 or k is None) and json.loads(spec_text) is not None


@pytest.mark.parametrize("proposer", ["draft", "ngram"])
def test_sampled_output_keeps_to_the_grammar(spec_engine, proposer):
    grammar = grammar_for_json(SCHEMA)
    for seed in range(4):
        _, result, text = _generate(
            spec_engine,
            grammar,
            sampling=SamplingSettings(temperature=1.5, seed=seed),
            speculation=SpeculationSettings(4, proposer=proposer),
        )
        assert result.finish_reason == "stop" and set(json.loads(text)) == {"ok", "n", "colour"}


@pytest.mark.parametrize("model, max_tokens", [(ShortStrings, 96), (FreeStrings, 64)])
def test_sampled_strings_hold_no_raw_control_characters(spec_engine, model, max_tokens):
    """50 seeds at temperature 1: llama-cpp-python's converter let the tiny pair write raw control
    characters (a byte token) into strings, which no JSON parser reads."""
    grammar, stopped = grammar_for_json(model.model_json_schema()), 0
    for seed in range(50):
        _, result, text = _generate(
            spec_engine,
            grammar,
            max_tokens=max_tokens,
            sampling=SamplingSettings(temperature=1.0, seed=seed),
            speculation=SpeculationSettings(4),
        )
        assert_json_strings(text, result.finish_reason == "stop", model, seed)
        stopped += result.finish_reason == "stop"
    assert stopped >= 25 or model is FreeStrings


def test_sampling_under_a_grammar_keeps_the_target_distribution(spec_engine):
    """Chi-square of the first two tokens against the target's distribution masked by the grammar
    (2,000 seeded runs; cells expected fewer than 5 times pooled; significance 0.001)."""
    target, draft = spec_engine.target, spec_engine.draft
    sampling = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0)
    prompt = target.tokenize("Once upon a time", add_bos=True, special=False)
    grammar = spec_engine.grammar(LETTERS)
    exact = {}
    target.truncate(0)
    first = logits_to_probs(grammar.mask(target.eval(prompt)[-1]), sampling)
    for t1 in np.flatnonzero(first):
        after = grammar.copy()
        after.accept(int(t1))
        target.truncate(len(prompt))
        second = logits_to_probs(after.mask(target.eval([int(t1)])[-1]), sampling)
        after.close()
        for t2 in np.flatnonzero(second):
            exact[(int(t1), int(t2))] = first[t1] * second[t2]
    grammar.close()
    n = 2000
    counts = dict.fromkeys(exact, 0)
    for seed in range(n):
        run_grammar = spec_engine.grammar(LETTERS)
        tokens = generate_tokens(
            target,
            draft,
            prompt,
            SamplingSettings(**(vars(sampling) | {"seed": seed})),
            SpeculationSettings(2),
            grammar=run_grammar,
        )
        pair = (next(tokens).id, next(tokens).id)
        tokens.close()
        run_grammar.close()
        counts[pair] += 1  # a pair the grammar forbids would be a KeyError
    assert_counts_follow(exact, counts)


def test_grammar_is_a_grammar_over_the_models_vocabulary(spec_engine):
    grammar = Grammar.for_model(spec_engine.target, 'root ::= "yes" | "no"')
    _, result, text = _generate(spec_engine, 'root ::= "yes" | "no"')
    assert text in ("yes", "no") and result.finish_reason == "stop"
    grammar.close()
