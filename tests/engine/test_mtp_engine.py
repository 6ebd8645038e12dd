"""The target's own MTP (NextN) layer drafting for it: greedy text is the target's alone at every K,
on one slot and on four, with a prompt longer than one batch."""

from dataclasses import replace

import pytest

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.errors import InvalidSetting
from ollama_spec.models.resolve import resolve_model
from ollama_spec.synthetic.mtp_target import write_mtp_target
from tests.conftest import engine_settings

GREEDY = SamplingSettings(temperature=0)
LONG = " ".join(f"item {i} is {'odd' if i % 2 else 'even'};" for i in range(130))
PROMPTS = [LONG, "The quick brown fox", "Once upon a time"]


@pytest.fixture(scope="module")
def mtp_target(tiny_models, tmp_path_factory):
    path = write_mtp_target(tmp_path_factory.mktemp("mtp") / "mtp-target.gguf", tiny_models[0].path)
    return resolve_model(str(path))


def request(prompt, k):
    return Request(
        prompt, raw=True, max_tokens=24, ignore_eos=True, sampling=GREEDY, speculation=SpeculationSettings(k)
    )


def answer(engine, req, slot=0):
    generation = engine.generate(req, slot=slot)
    "".join(generation)
    return generation.result


@pytest.fixture(scope="module")
def expected(mtp_target):
    with Engine(mtp_target, None, engine_settings()) as engine:
        return {p: answer(engine, request(p, None)).tokens for p in PROMPTS}


@pytest.mark.parametrize("parallel", [1, 4])
def test_greedy_text_is_the_targets_at_every_k(mtp_target, expected, parallel):
    with Engine(mtp_target, None, engine_settings(mtp=True, parallel=parallel)) as engine:
        assert engine.head is not None
        assert len(engine.prompt_tokens(request(LONG, 1))) > 512
        drafted = 0
        for k in (1, 2, 4, 8):
            for prompt in PROMPTS:
                result = answer(engine, request(prompt, k), slot=parallel - 1)
                assert result.tokens == expected[prompt], (k, prompt)
                drafted += result.speculation.drafted
        assert drafted > 0


def test_mtp_beside_a_draft_model_is_refused(mtp_target, tiny_models):
    with pytest.raises(InvalidSetting, match="MTP layers draft alone"):
        Engine(mtp_target, tiny_models[1], engine_settings(mtp=True))


def test_a_target_without_nextn_layers_says_so(tiny_models):
    from ollama_spec.errors import ModelLoadError

    with pytest.raises(ModelLoadError, match="no MTP .NextN. layers"):
        Engine(tiny_models[0], None, engine_settings(mtp=True))


def test_mtp_for_a_recurrent_target_is_refused(tmp_path):
    from tests.builders.recurrent import write_mamba_gguf

    path = tmp_path / "mamba.gguf"
    write_mamba_gguf(path)
    with pytest.raises(InvalidSetting, match="recurrent or hybrid model: .* its MTP layers cannot draft for it"):
        Engine(resolve_model(str(path)), None, engine_settings(mtp=True))


def test_the_mtp_head_drafts_under_each_name_that_takes_a_drafter(mtp_target):
    from ollama_spec.decoding.proposer_table import MTP, MtpProposer
    from ollama_spec.decoding.proposers import DRAFT, HYBRID, NGRAM, HybridProposer, NgramProposer

    with Engine(mtp_target, None, engine_settings(mtp=True)) as engine:
        built = {name: engine.proposer(SpeculationSettings(proposer=name)) for name in (DRAFT, MTP, HYBRID, NGRAM)}
        assert type(built[DRAFT]) is MtpProposer and type(built[MTP]) is MtpProposer
        assert built[DRAFT].source == MTP  # its tokens are the MTP layers', in the statistics too
        # beside n-gram lookup, the MTP layers' proposer, labelled as theirs
        assert type(built[HYBRID]) is HybridProposer and type(built[HYBRID].draft) is MtpProposer
        assert built[HYBRID].drafter == MTP
        assert type(built[NGRAM]) is NgramProposer
        # --draft mtp --ngram: greedy text is still the target's alone
        hybrid = replace(request(PROMPTS[1], 2), speculation=SpeculationSettings(2, proposer=HYBRID))
        result = answer(engine, hybrid)
        assert result.speculation.drafted > 0
        assert result.tokens[:24] == answer(engine, request(PROMPTS[1], None)).tokens[:24]


def test_a_crafted_nextn_layer_drafts_what_the_target_writes(tiny_models, tmp_path):
    """synthetic/mtp_target's crafted layer: most drafts accepted at K=1, and the text still the target's."""
    from ollama_spec.synthetic.mtp_target import MtpShape

    path = write_mtp_target(tmp_path / "crafted.gguf", tiny_models[0].path, MtpShape(crafted=True))
    target = resolve_model(str(path))
    with Engine(target, None, engine_settings()) as alone:
        expected = {p: answer(alone, request(p, None)).tokens for p in PROMPTS[1:]}
    with Engine(target, None, engine_settings(mtp=True)) as engine:
        drafted = accepted = 0
        for prompt in PROMPTS[1:]:
            result = answer(engine, request(prompt, 1))
            assert result.tokens == expected[prompt]
            drafted, accepted = drafted + result.speculation.drafted, accepted + result.speculation.accepted
    assert drafted > 20 and accepted / drafted > 0.5
