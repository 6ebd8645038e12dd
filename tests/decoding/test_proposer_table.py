"""Proposers by name (`proposer_table.PROPOSERS`) and the protocol's defaults: whoever builds a proposer
(the engine, the loop given a bare draft model) builds it from the table, and the loop asks every
proposer the same things, a lookup at K=0 included."""

import pytest

from ollama_spec.decoding.k_policy import FixedK
from ollama_spec.decoding.loop import SpeculationSettings, SpeculationStats, generate_tokens
from ollama_spec.decoding.proposer_table import PROPOSERS, build_proposer
from ollama_spec.decoding.proposers import (
    DRAFT,
    HYBRID,
    NGRAM,
    DraftModelProposer,
    HybridProposer,
    NgramProposer,
    Proposer,
)
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.errors import InvalidSetting
from tests.decoding.test_loop import run
from tests.decoding.test_proposers import REPETITIVE

GREEDY = SamplingSettings(temperature=0)
BUILT = {DRAFT: DraftModelProposer, NGRAM: NgramProposer, HYBRID: HybridProposer}


def test_every_name_in_the_table_builds_its_proposer(spec_engine):
    assert list(PROPOSERS) == [DRAFT, NGRAM, HYBRID]  # SpeculationSettings' error lists them in this order
    vocab = spec_engine.target.n_vocab
    for name, kind in PROPOSERS.items():
        proposer = build_proposer(name, spec_engine.draft, vocab, draft_p_min=0.2, ngram_size=3)
        assert type(proposer) is BUILT[name] and isinstance(proposer, Proposer)
        assert proposer.source in (DRAFT, NGRAM)
        # without a draft model, only a proposer that needs none is built
        assert (build_proposer(name, None, vocab) is None) == kind.needs_draft
    hybrid = build_proposer(HYBRID, spec_engine.draft, vocab, draft_p_min=0.2, ngram_size=3)
    assert (hybrid.draft.draft_p_min, hybrid.ngram.ngram_size) == (0.2, 3)
    with pytest.raises(InvalidSetting, match="unknown proposer 'nope': choose draft or ngram or draft\\+ngram"):
        SpeculationSettings(proposer="nope")


def test_the_engine_builds_each_name_from_the_table(spec_engine, baseline_engine):
    for name in PROPOSERS:
        assert type(spec_engine.proposer(SpeculationSettings(proposer=name))) is BUILT[name]
    assert type(baseline_engine.proposer(SpeculationSettings(proposer=NGRAM))) is NgramProposer
    assert baseline_engine.proposer(SpeculationSettings(proposer=HYBRID)) is None  # no draft model loaded


class Echo(Proposer):
    """A proposer that says only what the protocol asks for without a default: its source and its
    proposals (the text's last tokens again, mostly rejected). No lookup: the protocol's finds nothing."""

    source = "echo"

    def propose(self, seq, k, sampling, rng, keep_drafting=None, grammar=None, probe=""):
        return list(seq[-k:]), None


def test_a_proposer_without_a_lookup_finds_nothing_and_the_loop_runs_it(baseline_engine, spec_engine):
    assert Echo().lookup([1, 2, 1, 2], 8, FixedK.lookup_worth) == []
    drafting = DraftModelProposer(spec_engine.draft, spec_engine.target.n_vocab)
    assert drafting.lookup([1, 2, 1, 2], 8, FixedK.lookup_worth) == []  # a draft model looks nothing up
    expected = run(baseline_engine, REPETITIVE, raw=True, max_tokens=24, ignore_eos=True).tokens
    prompt = baseline_engine.target.tokenize(REPETITIVE, add_bos=True, special=False)
    for k, drafts in ((0, False), (2, True)):
        stats = SpeculationStats()
        tokens = generate_tokens(
            baseline_engine.target, Echo(), prompt, GREEDY, SpeculationSettings(2), stats, FixedK(k)
        )
        got = [next(tokens).id for _ in range(24)]
        tokens.close()
        assert got == expected  # verification keeps the target's text whatever was proposed
        assert ("echo" in stats.drafted_by_source) == drafts and set(stats.drafted_by_source) <= {"echo"}


def test_the_loop_given_a_draft_model_proposes_as_the_settings_name(baseline_engine, spec_engine):
    """K=0 throughout: a draft model alone proposes nothing, the hybrid built over it still looks the
    repeated sentence up."""
    expected = run(baseline_engine, REPETITIVE, raw=True, max_tokens=32, ignore_eos=True).tokens
    prompt = spec_engine.target.tokenize(REPETITIVE, add_bos=True, special=False)
    spec_engine.clear_cache()
    sources = {}
    for name in (DRAFT, HYBRID):
        stats = SpeculationStats()
        speculation = SpeculationSettings(None, proposer=name)
        tokens = generate_tokens(spec_engine.target, spec_engine.draft, prompt, GREEDY, speculation, stats, FixedK(0))
        got = [next(tokens).id for _ in range(32)]
        tokens.close()
        assert got == expected
        sources[name] = set(stats.drafted_by_source)
    assert sources == {DRAFT: set(), HYBRID: {NGRAM}}
