"""The EAGLE-3 proposer in the draft-verify loop: sampled text follows the target's own distribution
whatever the head proposes (rejection sampling with the head's q), and the head's drafts keep to a
grammar and to the penalties as a draft model's do."""

import pytest

from ollama_spec.decoding.eagle3 import HEAD, Eagle3Proposer
from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine
from tests.builders.eagle3_heads import build_heads
from tests.conftest import engine_settings
from tests.decoding.test_loop import assert_first_two_tokens_follow_the_target


@pytest.fixture(scope="module")
def heads(tiny_models, tmp_path_factory):
    return build_heads(tiny_models[0].path, tmp_path_factory.mktemp("heads"))


@pytest.mark.parametrize("kind", ["random", "crafted", "reduced"])
def test_sampling_with_a_head_keeps_the_target_distribution(kind, heads, tiny_models):
    """3,000 seeded runs, χ² of the first two tokens against the target's exact distribution (a
    temperature at which the crafted head's q is spread over its top tokens)."""
    sampling = SamplingSettings(temperature=2.5, top_k=4, top_p=1.0)
    with Engine(tiny_models[0], None, engine_settings(head=heads[kind])) as engine:
        proposer = engine.proposer(SpeculationSettings(2))
        assert isinstance(proposer, Eagle3Proposer) and proposer.source == HEAD
        assert_first_two_tokens_follow_the_target(engine.target, proposer, sampling, SpeculationSettings(2))
