"""A Generation runs on the pieces it is given (a target, a prompt, what ends a turn, a proposer and
the learned costs), not on an Engine."""

import pytest

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.costs import LearnedCosts
from ollama_spec.engine.generation import Generation, token_runs
from ollama_spec.engine.requests import Request
from ollama_spec.planning.placement import Placement
from ollama_spec.prompting.text_stream import Run, merge_runs

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


# Forces text whose characters span several byte tokens ("é": 2, "😘": 4) with a stop that
# holds text back across tokens: what the runs must still line up with.
ACCENTED = 'root ::= "naïve café " [a-z] [a-z] " 😘 end of it"'


@pytest.mark.parametrize("stop", [(), ("😘 end",)])
def test_pieces_are_the_same_text_split_by_which_model_wrote_it(spec_engine, stop):
    request = Request(
        "The quick brown fox",
        max_tokens=40,
        sampling=GREEDY,
        speculation=SpeculationSettings(3),
        grammar=ACCENTED,
        stop=stop,
        logprobs=0,  # keeps every token, with from_draft, to check the runs against
    )
    plain = spec_engine.generate(request)
    text = "".join(plain)
    generation = spec_engine.generate(request)
    runs = list(generation.pieces())
    assert all(isinstance(run, Run) and run.text for run in runs)
    assert "".join(run.text for run in runs) == generation.result.text == text
    assert text.startswith("naïve café ") and ("😘" not in text if stop else text.endswith(" 😘 end of it"))
    assert {run.from_draft for run in runs} == {True, False}  # the draft wrote some of it, the target the rest
    assert generation.result.tokens == plain.result.tokens
    assert merge_runs(runs) == token_runs(spec_engine.target, generation.result.scored, stop)
    # byte by byte: a character is drafted when every byte of it came from a drafted token
    flags = [
        token.from_draft for token in generation.result.scored for _ in spec_engine.target.token_piece(token.id)[0]
    ]
    expected, at = [], 0
    for c in text:
        expected.append(all(flags[at : at + len(c.encode())]))
        at += len(c.encode())
    assert [run.from_draft for run in runs for _ in run.text] == expected
    assert generation.result.drafted == expected and plain.result.drafted == []  # only pieces() marks the text


def test_a_target_alone_writes_no_drafted_run(baseline_engine):
    request = Request("The quick brown fox", max_tokens=12, sampling=GREEDY, ignore_eos=True)
    generation = baseline_engine.generate(request, use_draft=False)
    runs = list(generation.pieces())
    assert runs and not any(run.from_draft for run in runs)
    assert "".join(run.text for run in runs) == generation.result.text
    assert generation.result.drafted == [False] * len(generation.result.text)
