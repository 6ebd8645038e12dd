"""Logit bias and repetition penalties: llama.cpp's formula on hand-made rows, and the speculative loop
under them (greedy: the target alone's penalized answer; sampling: its penalized distribution)."""

import numpy as np
import pytest

from ollama_spec.decoding.loop import SpeculationSettings, generate_tokens
from ollama_spec.decoding.penalties import Penalties, adjusted, adjusted_rows
from ollama_spec.decoding.sampling import SamplingSettings, logits_to_probs
from ollama_spec.engine.engine import Request
from ollama_spec.errors import InvalidSetting
from tests.distribution import assert_counts_follow
from tests.greedy import assert_greedy_identical

STRONG = Penalties(repeat_penalty=1.5, repeat_last_n=16, presence_penalty=0.5, frequency_penalty=0.3)


def test_llama_cpp_formula_on_a_hand_made_row():
    row = np.array([2.0, -1.0, 0.5, 3.0, 1.0], dtype=np.float32)
    penalties = Penalties(
        repeat_penalty=2.0,
        repeat_last_n=3,
        presence_penalty=0.25,
        frequency_penalty=0.5,
        logit_bias=((4, -1.0), (2, 10.0)),
    )
    # the window is the last three tokens [1, 1, 3]: token 0 (earlier) is not penalized
    out = adjusted(row, [0, 0, 1, 1, 3], penalties)
    assert out.tolist() == pytest.approx([2.0, -1.0 * 2 - 2 * 0.5 - 0.25, 10.5, 3.0 / 2 - 0.5 - 0.25, 0.0])
    assert row.tolist() == [2.0, -1.0, 0.5, 3.0, 1.0]  # the input row is left alone
    assert adjusted(row, [0, 1], Penalties()).tolist() == row.tolist()
    assert not Penalties().active and not Penalties(repeat_penalty=1.3, repeat_last_n=0).active
    assert Penalties(logit_bias=((1, 5.0),)).active
    whole = Penalties(repeat_penalty=2.0, repeat_last_n=-1)
    assert adjusted(row, [0, 4, 3, 3], whole).tolist() == pytest.approx([1.0, -1.0, 0.5, 1.5, 1.0 / 2 - 0])


def test_row_i_of_a_verify_batch_reads_the_text_plus_i_drafts():
    rows = np.zeros((3, 6), dtype=np.float32) + 1.0
    out = adjusted_rows(rows, [5], [2, 3], Penalties(frequency_penalty=1.0))
    assert out.tolist() == [[1, 1, 1, 1, 1, 0], [1, 1, 0, 1, 1, 0], [1, 1, 0, 0, 1, 0]]


@pytest.mark.parametrize(
    "bad",
    [
        {"repeat_penalty": 0.0},
        {"repeat_penalty": 1e-40},
        {"repeat_penalty": 1e9},
        {"repeat_last_n": -2},
        {"presence_penalty": float("nan")},
    ],
)
def test_bad_values_are_refused(bad):
    with pytest.raises(InvalidSetting):
        Penalties(**bad)


def _generate(engine, penalties, use_draft=True, speculation=SpeculationSettings(), temperature=0.0):
    request = Request(
        "Describe the weather",
        max_tokens=60,
        raw=True,
        sampling=SamplingSettings(temperature=temperature, seed=0, penalties=penalties),
        speculation=speculation,
    )
    generation = engine.generate(request, use_draft=use_draft)
    "".join(generation)
    return request, generation.result


@pytest.mark.parametrize("k", [1, 3, 8, None])
def test_greedy_with_penalties_is_the_target_alones_penalized_answer(spec_engine, k):
    request, expected = _generate(spec_engine, STRONG, use_draft=False)
    _, plain = _generate(spec_engine, Penalties(), use_draft=False)
    assert expected.tokens != plain.tokens  # the penalties do change the answer...
    _, result = _generate(spec_engine, STRONG, speculation=SpeculationSettings(k))
    assert_greedy_identical(spec_engine, request, expected.tokens, result.tokens)  # ...and speculation keeps it
    assert result.speculation.drafted > 0 or k is None  # auto may find the tiny pair's drafts do not pay


def test_a_repeat_penalty_without_end_forbids_repeats_in_its_window(spec_engine):
    _, result = _generate(
        spec_engine,
        Penalties(repeat_penalty=1.0, presence_penalty=1e6, repeat_last_n=8),
        speculation=SpeculationSettings(4),
    )
    tokens = result.tokens
    assert all(tokens[i] not in tokens[max(0, i - 8) : i] for i in range(len(tokens)))


def test_logit_bias_bans_and_forces(spec_engine):
    _, plain = _generate(spec_engine, Penalties(), speculation=SpeculationSettings(4))
    banned = plain.tokens[0]
    _, result = _generate(
        spec_engine, Penalties(logit_bias=((banned, float("-inf")),)), speculation=SpeculationSettings(4)
    )
    assert banned not in result.tokens
    forced = plain.tokens[5]
    _, result = _generate(
        spec_engine, Penalties(logit_bias=((forced, 100.0),)), speculation=SpeculationSettings(4), temperature=1.0
    )
    assert set(result.tokens) == {forced}


def test_sampling_with_penalties_keeps_the_target_distribution(spec_engine):
    """Chi-square of the first two tokens against the target's penalized distribution (2,000 seeded
    runs at K=2; significance 0.001): the second row must be adjusted by the first token. A negative
    frequency penalty over a short window rewards repeating it, so a second row that missed it would
    show at once."""
    target, draft = spec_engine.target, spec_engine.draft
    penalties = Penalties(frequency_penalty=-3.0, repeat_last_n=2)
    sampling = SamplingSettings(temperature=1.0, top_k=8, top_p=1.0, penalties=penalties)
    prompt = target.tokenize("Once upon a time", add_bos=True, special=False)
    exact = {}
    target.truncate(0)
    first = logits_to_probs(adjusted(target.eval(prompt)[-1], prompt, penalties), sampling)
    for t1 in np.flatnonzero(first):
        target.truncate(len(prompt))
        second = logits_to_probs(adjusted(target.eval([int(t1)])[-1], [*prompt, int(t1)], penalties), sampling)
        for t2 in np.flatnonzero(second):
            exact[(int(t1), int(t2))] = first[t1] * second[t2]
    counts = dict.fromkeys(exact, 0)
    for seed in range(2000):
        tokens = generate_tokens(
            target, draft, prompt, SamplingSettings(**(vars(sampling) | {"seed": seed})), SpeculationSettings(2)
        )
        pair = (next(tokens).id, next(tokens).id)
        tokens.close()
        counts[pair] += 1  # a pair the penalized top-k excludes would be a KeyError
    assert_counts_follow(exact, counts)


def test_compare_judges_a_difference_on_the_rows_the_request_chose_from(spec_engine):
    """--compare and bench tell near-ties from errors by the target's top-two gap: under penalties and a
    grammar that gap must be the penalized, masked rows', not the raw logits'."""
    request, expected = _generate(spec_engine, STRONG, use_draft=False)
    prompt = spec_engine.prompt_tokens(request)
    raw = spec_engine.greedy_margins(prompt, expected.tokens)
    chosen = spec_engine.greedy_margins(prompt, expected.tokens, request=request)
    text = list(prompt)
    target = spec_engine.target
    for at, token in enumerate(expected.tokens[:10]):
        target.truncate(0)
        row = adjusted(target.eval(text)[-1], text, STRONG)
        top2 = np.sort(row)[-2:]
        assert chosen[at] == pytest.approx(float(top2[1] - top2[0]), abs=0.02)
        text.append(token)
    assert raw != pytest.approx(chosen, abs=0.02)
    forced = Request(
        "Describe the weather",
        max_tokens=3,
        raw=True,
        grammar='root ::= "a" "b" "c"',
        sampling=SamplingSettings(temperature=0),
    )
    generation = spec_engine.generate(forced, use_draft=False)
    "".join(generation)
    margins = spec_engine.greedy_margins(spec_engine.prompt_tokens(forced), generation.result.tokens, request=forced)
    assert all(m == float("inf") for m in margins)  # one allowed token at each place: never a tie
