"""The EAGLE-3 proposer in the draft-verify loop: sampled text follows the target's own distribution
whatever the head proposes (rejection sampling with the head's q), and the head's drafts keep to a
grammar and to the penalties as a draft model's do."""

import pytest

from ollama_spec.decoding.eagle3 import HEAD, Eagle3Proposer
from ollama_spec.decoding.k_policy import PROBE_ACCEPTANCE
from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.proposers import PROBE_WINDOW
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from tests.builders.eagle3_heads import build_heads
from tests.conftest import engine_settings
from tests.decoding.test_loop import assert_first_two_tokens_follow_the_target

GREEDY = SamplingSettings(temperature=0)


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


def test_a_probe_reads_at_most_a_window_of_what_the_head_lacks(heads, tiny_models):
    """After steps at K=0 (the target alone), a probe's draft reads PROBE_WINDOW pairs and its own
    step, not every position the head lacks; a draft that is no probe reads them all."""
    with Engine(tiny_models[0], None, engine_settings(head=heads["crafted"])) as engine:
        proposer = engine.proposer(SpeculationSettings(1))
        request = Request("Once upon a time", raw=True, max_tokens=60, ignore_eos=True, sampling=GREEDY)
        generation = engine.generate(request, use_draft=False)
        "".join(generation)
        seq = [*engine.target.cached_of(0), generation.result.tokens[-1]]
        assert len(seq) - 1 > 2 * PROBE_WINDOW
        process, sizes = engine.head._process, []
        engine.head._process = lambda kind, n: sizes.append(n) or process(kind, n)
        probed, _ = proposer.propose(seq, 1, GREEDY, None, probe=PROBE_ACCEPTANCE)
        assert sizes and max(sizes) <= PROBE_WINDOW + 1
        sizes.clear()
        drafted, _ = proposer.propose(seq, 1, GREEDY, None)
        assert max(sizes) >= len(seq) - 1 and len(drafted) == len(probed) == 1


def test_a_new_request_follows_every_pass_whatever_the_last_one_said(heads, tiny_models):
    """A request at K=0 tells the head it will not draft for a while; the next request on the same
    sequence (a chat's next turn, its prompt after the cached text) follows its prompt's passes."""
    with Engine(tiny_models[0], None, engine_settings(head=heads["crafted"])) as engine:
        proposer = engine.proposer(SpeculationSettings(1))
        request = Request("Once upon a time", raw=True, max_tokens=8, ignore_eos=True, sampling=GREEDY)
        "".join(engine.generate(request, use_draft=False))
        seq = [*engine.target.cached_of(0), 42]
        proposer.idle(seq, 200)
        proposer.reset(seq)
        engine.target.eval([42, 43, 44])
        state = engine.head._state[0]
        assert state.rows[0] + len(state.rows[1]) == len(seq) + 2 and state.pending[0] == len(seq) + 1
