"""Proposers on their own: n-gram lookup on token lists, then through the loop (the draft model's
tests are in test_loop.py)."""

from contextlib import contextmanager

import numpy as np
import pytest

from ollama_spec.decoding.k_fixed import FixedK
from ollama_spec.decoding.k_tuning import PROBE_ACCEPTANCE, PROBE_COSTS
from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.proposers import (
    PROBE_WINDOW,
    DraftModelProposer,
    HybridProposer,
    NgramProposer,
    Proposer,
)
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


HYBRID = SpeculationSettings(None, proposer="draft+ngram")


def test_draft_model_and_lookup_together_are_exact_and_both_propose(baseline_engine, spec_engine):
    expected = run(baseline_engine, REPETITIVE, raw=True, max_tokens=48, ignore_eos=True).tokens
    for k in (None, 2, 4):
        speculation = SpeculationSettings(k, proposer="draft+ngram")
        result = run(spec_engine, REPETITIVE, raw=True, max_tokens=48, ignore_eos=True, speculation=speculation)
        assert result.tokens == expected
        stats = result.speculation
        assert sum(stats.drafted_by_source.values()) == stats.drafted
        assert sum(stats.accepted_by_source.values()) == stats.accepted
        if k is not None:  # (auto may find that drafting does not pay for the tiny pair: K=0 throughout)
            assert stats.drafted_by_source.get("ngram", 0) > 0  # the repeated sentence is looked up


def test_draft_model_and_lookup_keep_the_target_distribution(spec_engine):
    sampling = SamplingSettings(temperature=1.0, top_k=4, top_p=1.0)
    proposer = spec_engine.proposer(HYBRID)
    assert isinstance(proposer, HybridProposer)
    assert_first_two_tokens_follow_the_target(
        spec_engine.target, proposer, sampling, SpeculationSettings(3), prompt=REPETITIVE
    )


class _ScriptedDraft(Proposer):
    """Stands in for the draft model's proposer where only the hybrid's choice is tested."""

    def __init__(self, tokens):
        self.tokens, self.calls = tokens, 0

    def reset(self, seq):
        pass

    def propose(self, seq, k, sampling, rng, keep_drafting=None, grammar=None, probe=False):
        self.calls += 1
        return self.tokens[:k], None

    def accepted(self, seq):
        pass


def _step(hybrid, seq, k, accepted_of_proposal):
    tokens, _ = hybrid.propose(seq, k, GREEDY, np.random.default_rng(0))
    seq = [*seq, *tokens[:accepted_of_proposal], 99]
    hybrid.accepted(seq)
    return tokens, seq


def test_hybrid_takes_a_long_lookup_and_learns_when_lookups_miss():
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3]  # "1 2 3" repeats: the lookup offers 4..12
    draft = _ScriptedDraft([50, 51])
    hybrid = HybridProposer(draft, NgramProposer(3))
    tokens, _ = _step(hybrid, text, 8, accepted_of_proposal=0)
    assert hybrid.source == "ngram" and tokens == [4, 5, 6, 7, 8][: len(tokens)] and draft.calls == 0
    for _ in range(30):  # every lookup misses at once: the lookup's acceptance falls, the draft takes over
        _step(hybrid, text, 8, accepted_of_proposal=0)
    _step(hybrid, text, 8, accepted_of_proposal=0)
    assert hybrid.source == "draft" and draft.calls > 0


def test_lookups_learn_their_acceptance_by_the_size_of_their_match():
    """Short matches that miss do not silence long ones: a 2-gram found in new text is seldom followed
    as before, a 4-gram in a quote nearly always."""
    ngram = NgramProposer(4)
    short = [5, 6, 1, 2, 7, 8, 9, 1, 2]  # ends in "1 2", seen once before: a 2-gram match
    for _ in range(20):
        tokens, _ = ngram.propose(short, 4, GREEDY, np.random.default_rng(0))
        assert ngram.matched == 2 and tokens
        ngram.accepted([*short, 99])  # missed at once
    assert ngram.alphas(1)[0] < 0.2
    quote = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4]  # ends in "1 2 3 4": a 4-gram match
    tokens = ngram.lookup(quote, 8, FixedK.lookup_worth)
    assert ngram.matched == 4 and tokens and tokens == [5, 6, 7, 1, 2, 3, 4][: len(tokens)]  # still proposed
    nothing = ngram.lookup(short, 8, FixedK.lookup_worth)
    assert nothing == []  # the 2-gram's misses: not worth a verify batch at K=0


def test_hybrid_leaves_text_without_repeats_to_the_draft_model():
    draft = _ScriptedDraft([50, 51, 52])
    hybrid = HybridProposer(draft, NgramProposer(3))
    tokens, _ = _step(hybrid, [1, 2, 3, 4, 5, 6], 4, accepted_of_proposal=2)
    assert hybrid.source == "draft" and tokens == [50, 51, 52]


@contextmanager
def counted_evals(model):
    """The lengths of the batches `model` evaluates inside the block."""
    calls, real_eval = [], model.eval

    def counted(tokens, **kwargs):
        calls.append(len(tokens))
        return real_eval(tokens, **kwargs)

    model.eval = counted
    try:
        yield calls
    finally:
        del model.eval


def test_after_steps_without_drafting_the_draft_catches_up_in_one_batch(spec_engine):
    """K=0 costs the draft nothing: it is not fed while the target runs alone, and reads the tokens it
    missed in one evaluation when it drafts again."""
    draft = spec_engine.draft
    proposer = DraftModelProposer(draft, spec_engine.target.n_vocab)
    seq = spec_engine.target.tokenize("The quick brown fox", add_bos=True, special=False)
    proposer.reset(seq)
    proposer.propose(seq, 2, GREEDY, np.random.default_rng(0))
    with counted_evals(draft) as calls:
        for token in (11, 12, 13, 14, 15, 16):  # six K=0 steps: the target's tokens, the draft untouched
            seq = [*seq, token]
            proposer.accepted(seq)
        assert calls == []
        proposer.propose(seq, 1, GREEDY, np.random.default_rng(0))
    assert calls[0] >= 6 and len(calls) == 1  # one catch-up batch, which also yields the first draft
    assert draft.n_past == len(seq)


def test_beside_other_slots_the_draft_catches_up_a_bounded_piece_a_step(spec_engine):
    """With `catch_up` set (a slot beside others), a draft far behind after a stretch at K=0 reads at
    most that many of the tokens it missed in a step, drafting nothing, until the rest fits in one: no
    step carries a draft pass as long as the stretch."""
    draft = spec_engine.draft
    proposer = DraftModelProposer(draft, spec_engine.target.n_vocab)
    proposer.catch_up = 8
    seq = spec_engine.target.tokenize("The quick brown fox", add_bos=True, special=False)
    proposer.reset(seq)
    proposer.propose(seq, 1, GREEDY, np.random.default_rng(0))
    seq = [*seq, *range(20, 50)]  # 30 tokens at K=0
    proposer.accepted(seq)
    with counted_evals(draft) as calls:
        steps = 1
        while not proposer.propose(seq, 2, GREEDY, np.random.default_rng(0))[0]:
            seq = [*seq, 60 + steps]  # a step without drafts: the target's own token
            proposer.accepted(seq)
            steps += 1
    assert max(calls) <= 8 and steps >= 30 // 8  # each step a piece; the last one drafts as well
    assert draft.n_past == len(seq) + 1  # caught up, and its first draft fed to draft the second


def test_a_probe_after_a_long_gap_reads_only_its_end_and_gives_it_back(spec_engine):
    """A probe (the K policy asking whether drafting pays again) does not catch the draft up on all it
    missed: it reads the last PROBE_WINDOW tokens after what the draft holds, drafts, and the cache is
    cut back to the synced part; a real drafting step then reads the whole gap."""
    draft = spec_engine.draft
    proposer = DraftModelProposer(draft, spec_engine.target.n_vocab)
    seq = spec_engine.target.tokenize("The quick brown fox", add_bos=True, special=False)
    proposer.reset(seq)
    proposer.propose(seq, 1, GREEDY, np.random.default_rng(0))
    synced = draft.n_past
    seq = [*seq, *range(20, 20 + PROBE_WINDOW + 10)]  # a long stretch at K=0
    proposer.accepted(seq)
    with counted_evals(draft) as calls:
        drafted, _ = proposer.propose(seq, 1, GREEDY, np.random.default_rng(0), probe=PROBE_ACCEPTANCE)
        assert calls == [PROBE_WINDOW] and len(drafted) == 1
        proposer.accepted([*seq, 7])  # the probe's draft rejected, the target's own token instead
        assert draft.n_past == synced and list(draft.cached) == seq[:synced]
        calls.clear()
        proposer.propose([*seq, 7], 1, GREEDY, np.random.default_rng(0))
        assert calls == [len(seq) + 1 - synced]  # drafting again: the whole gap in one batch
    short = [*seq, 7, 8, 9]  # a probe after a gap shorter than the window reads all of it, as usual
    proposer.accepted(short)
    proposer.propose(short, 1, GREEDY, np.random.default_rng(0), probe=PROBE_ACCEPTANCE)
    proposer.accepted([*short, 1])
    assert draft.n_past == len(short)
    fresh = DraftModelProposer(draft, spec_engine.target.n_vocab)
    fresh.reset([])  # a draft that has read nothing of this text (K=0 since the first step): the probe
    with counted_evals(draft) as calls:  # reads all of it, for a guess from the whole text and not 16 tokens
        fresh.propose(seq, 1, GREEDY, np.random.default_rng(0), probe=PROBE_ACCEPTANCE)
    assert calls == [len(seq)] and list(draft.cached[: len(seq)]) == seq
    fresh.accepted([*seq, 7])
    assert draft.n_past == len(seq)  # and keeps it: later probes read only the end of what follows
    cheap = DraftModelProposer(draft, spec_engine.target.n_vocab)
    cheap.reset([])  # a probe of the costs only (no acceptance would make drafting pay): the window after BOS
    with counted_evals(draft) as calls:
        cheap.propose(seq, 1, GREEDY, np.random.default_rng(0), probe=PROBE_COSTS)
    assert calls == [PROBE_WINDOW + 1] and draft.cached[0] == seq[0]
    cheap.accepted([*seq, 7])
    assert draft.n_past == 0


def test_at_k0_the_hybrid_still_offers_a_lookup_worth_a_token():
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 1, 2, 3]
    draft = _ScriptedDraft([50, 51])
    hybrid = HybridProposer(draft, NgramProposer(3))
    tokens = hybrid.lookup(text, 8, FixedK.lookup_worth)
    assert tokens and hybrid.source == "ngram" and draft.calls == 0
    nothing = hybrid.lookup([1, 2, 3, 4, 5, 6], 8, FixedK.lookup_worth)
    assert nothing == [] and draft.calls == 0  # no match: no draft model either, K is 0


@pytest.mark.parametrize("speculation", [HYBRID, SpeculationSettings(None, proposer="ngram")], ids=["hybrid", "ngram"])
def test_the_loop_verifies_lookups_while_drafting_does_not_pay(baseline_engine, spec_engine, speculation):
    """K=0 from the policy (drafting never pays), yet the repeated sentence is looked up: a lookup
    costs no draft step, and whether it pays depends on this step's match, not on the policy's α."""
    from ollama_spec.decoding.loop import SpeculationStats, generate_tokens

    expected = run(baseline_engine, REPETITIVE, raw=True, max_tokens=32, ignore_eos=True).tokens
    prompt = spec_engine.target.tokenize(REPETITIVE, add_bos=True, special=False)
    stats = SpeculationStats()
    tokens = generate_tokens(
        spec_engine.target,
        spec_engine.proposer(speculation),
        prompt,
        GREEDY,
        speculation,
        stats,
        FixedK(0),
    )
    got = [next(tokens).id for _ in range(32)]
    tokens.close()
    assert got == expected
    assert stats.drafted_by_source.get("ngram", 0) > 0 and "draft" not in stats.drafted_by_source


QUOTE = [1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4]  # ends in "1 2 3 4": a 4-gram match, followed by 5 6 7 1 2 ...


def _settle_one_lookup(ngram: NgramProposer, followed: int) -> None:
    """One 4-gram lookup at K=0, taken at the prior, whose first `followed` tokens are accepted."""
    proposal = ngram.lookup(QUOTE, 8, lambda alphas: pytest.fail("priced before any lookup was settled"))
    assert proposal == [5, 6, 7, 1, 2]  # at the prior, wherever a token is expected: 0.8^6 < the floor
    ngram.accepted([*QUOTE, *proposal[:followed], 99])
    ngram.reset([])


def test_a_lookup_at_k0_proposes_as_many_tokens_as_the_policy_says_pay():
    """Once a lookup of its size has been settled, the lookup hands the policy each position's
    acceptance (cut at the survival floor) and proposes as many tokens as it answers."""
    ngram = NgramProposer(4)
    _settle_one_lookup(ngram, followed=5)
    asked = []
    assert ngram.lookup(QUOTE, 8, lambda alphas: asked.append(list(alphas)) or 2) == [5, 6]
    assert len(asked) == 1 and len(asked[0]) > 5 and min(asked[0]) > 0.8  # learned: all five were accepted
    assert ngram.lookup(QUOTE, 8, lambda alphas: 0) == []


@pytest.mark.parametrize("went_on, learns", [([5, 6, 7, 1, 2, 3, 4, 5], "more"), ([5, 9], "less")])
def test_a_lookup_left_unverified_is_learned_from_how_the_text_went_on(went_on, learns):
    """A lookup the policy refused still teaches: once the text has followed all of it, or parted
    from it, that counts as a proposal accepted that far. Else a lookup priced as not paying would
    never learn that the answer has begun to quote."""
    ngram = NgramProposer(4)
    _settle_one_lookup(ngram, followed=1)
    before = ngram.pooled[4].alpha
    offered = ngram.worth_verifying(8)[0]
    assert ngram.lookup(QUOTE, 8, lambda alphas: 0) == []
    seq = list(QUOTE)
    for token in went_on:  # the target alone, a token a step
        seq.append(token)
        ngram.accepted(seq)
        settled = ngram.pooled[4].alpha != before
        assert settled == (len(seq) - len(QUOTE) >= min(offered, len(went_on)))  # not before the text says
    assert (ngram.pooled[4].alpha > before) == (learns == "more")


def _first_earlier_match(seq, k, size, min_size=2):
    """The lookup by brute force: the first earlier occurrence of the longest suffix, what followed it."""
    for n in range(min(size, len(seq) - 1), min_size - 1, -1):
        for start in range(len(seq) - n):
            if seq[start : start + n] == seq[-n:]:
                return n, seq[start + n : start + n + k]
    return 0, []


def test_the_lookup_kept_up_as_the_text_grows_finds_what_a_full_search_finds():
    """The n-gram index is brought up to each new text, not rebuilt: the same match and proposal as a
    search of the whole text, as the text grows, and for another text given without a reset."""
    rng = np.random.default_rng(1)
    proposer = NgramProposer(4)
    matched = 0
    for _ in range(40):
        vocab = int(rng.integers(3, 20))
        seq = [int(t) for t in rng.integers(0, vocab, int(rng.integers(2, 6)))]
        for _ in range(40):
            found = proposer.find(seq, 8)
            assert (proposer.matched, found) == _first_earlier_match(seq, 8, 4)
            matched += proposer.matched > 0
            seq += [int(t) for t in rng.integers(0, vocab, int(rng.integers(1, 4)))]
    assert matched > 100  # the texts repeat enough to match often
    proposer.reset([])
    assert proposer.find([5, 6, 7, 5, 6], 3) == [7, 5, 6] and proposer.matched == 2
