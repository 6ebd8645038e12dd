"""Proposers on their own: n-gram lookup on token lists, then through the loop (the draft model's
tests are in test_loop.py)."""

import numpy as np

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.proposers import NgramProposer
from ollama_spec.decoding.sampling import SamplingSettings
from tests.decoding.test_loop import assert_first_two_tokens_follow_the_target, run

GREEDY = SamplingSettings(temperature=0)


def propose(seq, k, size=3):
    return NgramProposer(size).propose(list(seq), k, GREEDY, np.random.default_rng(0))


def test_ngram_proposes_what_followed_the_first_match_of_the_longest_suffix():
    #        0  1  2  3  4  5  6  7  8  9 10 11 12 13
    seq = [7, 1, 2, 3, 9, 8, 1, 2, 3, 4, 5, 1, 2, 3]
    assert propose(seq, 2) == ([9, 8], None)  # "1 2 3" first seen at 1..3, followed by 9 8
    assert propose(seq, 20) == (seq[4:], None)  # never past the end of the text
    assert propose([5, 6, 7, 6], 3) == ([], None)  # a lone matching token is no evidence: no 1-grams
    assert propose([5, 6, 7, 5, 6], 3) == ([7, 5, 6], None)  # down to 2-grams
    assert propose([1, 2, 3, 4], 3) == ([], None)  # nothing repeats: nothing to propose
    assert propose([1], 3) == ([], None)
    assert propose([4, 2, 4, 2, 9, 4, 2], 2, size=1) == ([4, 2], None)  # size 1: after the first "2"
    assert propose([9, 2, 5, 4, 2, 8, 4, 2], 2) == ([8, 4], None)  # "4 2" beats an earlier lone "2"


REPETITIVE = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick"


def test_ngram_lookup_is_exact_and_drafts_from_the_prompt(baseline_engine):
    expected = run(baseline_engine, REPETITIVE, raw=True, max_tokens=40, ignore_eos=True).tokens
    for k in (None, 2, 6):
        result = run(
            baseline_engine,
            REPETITIVE,
            raw=True,
            max_tokens=40,
            ignore_eos=True,
            speculation=SpeculationSettings(k, proposer="ngram"),
        )
        assert result.tokens == expected
        assert result.speculation.drafted > 0


def test_ngram_lookup_keeps_the_target_distribution(baseline_engine):
    sampling = SamplingSettings(temperature=1.0, top_k=4, top_p=1.0)
    assert_first_two_tokens_follow_the_target(
        baseline_engine.target, NgramProposer(), sampling, SpeculationSettings(3), prompt=REPETITIVE
    )
