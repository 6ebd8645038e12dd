"""The draft sources by name (`proposer_table.PROPOSERS`) and the protocol's defaults: whoever builds a
proposer (the engine, the loop given a bare draft model) builds it from the table, whoever reads a draft's
name reads it there and nowhere else, and the loop asks every proposer the same things, a lookup at K=0
included."""

import ast
from pathlib import Path

import pytest

import ollama_spec
from ollama_spec.decoding.k_fixed import FixedK
from ollama_spec.decoding.loop import SpeculationSettings, SpeculationStats, generate_tokens
from ollama_spec.decoding.proposer_table import (
    AUTO,
    MTP,
    MTP_HYBRID,
    PROPOSERS,
    build_proposer,
    head_source,
    is_auto,
    is_lookup,
    named_source,
    needs_nextn,
    proposer_for,
)
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
    # SpeculationSettings' error lists them in this order
    assert list(PROPOSERS) == [DRAFT, NGRAM, HYBRID, MTP, MTP_HYBRID]
    vocab = spec_engine.target.n_vocab
    for name, kind in PROPOSERS.items():
        if kind.needs_nextn:  # over a draft model, none: only over the target's own MTP head (test_mtp_engine)
            assert build_proposer(name, spec_engine.draft, vocab) is None and name in (MTP, MTP_HYBRID)
            continue
        proposer = build_proposer(name, spec_engine.draft, vocab, draft_p_min=0.2, ngram_size=3)
        assert type(proposer) is BUILT[name] and isinstance(proposer, Proposer)
        assert proposer.source in (DRAFT, NGRAM)
        # without a draft model, only a proposer that needs none is built
        assert (build_proposer(name, None, vocab) is None) == kind.needs_draft
    hybrid = build_proposer(HYBRID, spec_engine.draft, vocab, draft_p_min=0.2, ngram_size=3)
    assert (hybrid.draft.draft_p_min, hybrid.ngram.ngram_size) == (0.2, 3)
    with pytest.raises(
        InvalidSetting, match="unknown proposer 'nope': choose draft or ngram or draft\\+ngram or mtp or mtp\\+ngram"
    ):
        SpeculationSettings(proposer="nope")


def test_the_engine_builds_each_name_from_the_table(spec_engine, baseline_engine):
    for name, built in BUILT.items():
        assert type(spec_engine.proposer(SpeculationSettings(proposer=name))) is built
    assert spec_engine.proposer(SpeculationSettings(proposer=MTP)) is None  # no MTP layers loaded
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


# --- the registry is the one place that compares a source's name ---------------------------------------

PACKAGE = Path(ollama_spec.__file__).parent
# the registry, and the proposers, which define the names and label each step's proposal with one
REGISTRY = (PACKAGE / "decoding" / "proposer_table.py", PACKAGE / "decoding" / "proposers.py")


def _strings(node: ast.AST) -> list[str]:
    """The string literals an operand of a comparison is, or holds (a tuple, list or set of them)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return [s for element in node.elts for s in _strings(element)]
    return []


# Names that are words with other meanings too (flash attention's auto, tool_choice's, -k's; a model's
# role, a Modelfile's DRAFT line): compared as a source's only beside a draft, a proposer or a source.
_WORDS = (AUTO, DRAFT)
_CONTEXT = ("draft", "proposer", "source")
_CONSTANTS = (
    "AUTO",
    "DRAFT",
    "NGRAM",
    "HYBRID",
    "MTP",
    "MTP_HYBRID",
)  # the names' constants: compared only where defined


def compared_source_names(source: str) -> list[str]:
    """Each comparison in `source` of a draft source's name (or `auto`) as a string."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for operand in operands:
            others = " ".join(ast.unparse(o) for o in operands if o is not operand).lower()
            if isinstance(operand, (ast.Name, ast.Attribute)) and ast.unparse(operand).split(".")[-1] in _CONSTANTS:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
            named = {text.lower() for text in _strings(operand)}
            in_context = any(word in others for word in _CONTEXT)
            if (named & set(PROPOSERS)) - set(_WORDS) or (named & set(_WORDS) and in_context):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_but_the_registry_compares_a_source_name_as_a_string():
    offenders = {
        str(path.relative_to(PACKAGE.parent)): hits
        for path in sorted(PACKAGE.rglob("*.py"))
        if path not in REGISTRY and (hits := compared_source_names(path.read_text(encoding="utf-8")))
    }
    assert offenders == {}


def test_the_check_finds_the_comparisons_it_forbids():
    assert compared_source_names('if draft.lower() == "ngram": pass') != []
    assert compared_source_names('ok = chosen in ("x", "draft+ngram")') != []
    assert compared_source_names('if draft.lower() in ("auto", "y"): pass') != []
    assert compared_source_names('if self.source == "draft": pass') != []
    assert compared_source_names("if draft.lower() == NGRAM: pass") != []
    assert compared_source_names('if flash_attention == "auto": pass') == []  # another auto
    assert compared_source_names('if role == "draft": pass') == []  # a model's role
    assert compared_source_names("if named_source(draft) is not None: pass") == []


def test_auto_and_each_source_name_are_defined_once():
    definitions = {}
    for path in PACKAGE.rglob("*.py"):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            for target in targets:
                for name in [t.id for t in ast.walk(target) if isinstance(t, ast.Name)]:
                    definitions.setdefault(name, []).append(str(path.relative_to(PACKAGE.parent)))
    for name in ("AUTO", "NGRAM", "DRAFT", "HYBRID", "MTP", "MTP_HYBRID"):
        assert len(definitions.get(name, [])) == 1, (name, definitions.get(name))


def test_a_draft_named_by_the_user_is_read_in_the_registry():
    assert [named_source(text) for text in ("ngram", "NGram", "auto", "llama3.2:1b", "draft", None, "MTP")] == [
        NGRAM,
        NGRAM,
        None,
        None,
        None,
        None,
        MTP,
    ]
    assert [is_auto(text) for text in ("auto", "AUTO", "ngram", None)] == [True, True, False, False]
    assert proposer_for("ngram", with_ngram=True) == NGRAM  # lookup alone: nothing beside it to pair with
    assert (proposer_for("tiny-draft"), proposer_for(None, with_ngram=True)) == (DRAFT, HYBRID)
    # auto picks a draft model or the target's own MTP layers
    assert [name for name, kind in PROPOSERS.items() if kind.auto] == [DRAFT, MTP]


def test_the_target_s_mtp_layers_are_a_drafter_of_their_own():
    assert proposer_for("mtp") == MTP and needs_nextn(MTP) and not needs_nextn(DRAFT) and not needs_nextn(None)
    assert proposer_for("mtp", with_ngram=True) == HYBRID  # the MTP head beside n-gram lookup
    assert not is_lookup(MTP)  # its proposals cost a draft step, as a draft model's do
    # a plain draft, where the loaded head is the target's MTP layers, is theirs
    assert [head_source(name, True) for name in (DRAFT, HYBRID, NGRAM, MTP)] == [MTP, MTP_HYBRID, NGRAM, MTP]
    assert head_source(DRAFT, False) == DRAFT
