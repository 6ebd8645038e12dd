"""A Generation runs on the pieces it is given (a target, a prompt, what ends a turn, a proposer and
the learned costs), not on an Engine."""

from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.costs import LearnedCosts
from ollama_spec.engine.generation import Generation
from ollama_spec.engine.requests import Request
from ollama_spec.planning.placement import Placement

GREEDY = SamplingSettings(temperature=0)


def test_a_generation_over_the_bare_pieces_gives_the_engines_answer(baseline_engine):
    request = Request("The quick brown fox", max_tokens=12, sampling=GREEDY, ignore_eos=True)
    expected = baseline_engine.generate(request, use_draft=False)
    "".join(expected)
    target = baseline_engine.target
    prompt = baseline_engine.prompt_tokens(request)
    costs = LearnedCosts(target, None, Placement(), notice=lambda text: None)
    generation = Generation(
        target, request, lambda: prompt, end_of_turn=lambda token: False, proposer=None, costs=costs
    )
    assert "".join(generation) == expected.result.text
    assert generation.result.tokens == expected.result.tokens and generation.result.finish_reason == "length"


def test_the_end_of_turn_it_is_given_ends_the_answer(baseline_engine):
    request = Request("The quick brown fox", max_tokens=12, sampling=GREEDY)
    target = baseline_engine.target
    alone = baseline_engine.generate(request, use_draft=False)
    "".join(alone)
    third = alone.result.tokens[2]
    costs = LearnedCosts(target, None, Placement(), notice=lambda text: None)
    generation = Generation(
        target,
        request,
        lambda: baseline_engine.prompt_tokens(request),
        end_of_turn=lambda token: token == third,
        proposer=None,
        costs=costs,
    )
    "".join(generation)
    assert generation.result.tokens == alone.result.tokens[: alone.result.tokens.index(third)]
    assert generation.result.finish_reason == "stop"
