"""The acceptance rules on hand-made distributions: no model involved."""

import numpy as np
import pytest

from ollama_spec.decoding.sampling import SamplingSettings, logits_to_probs, sample
from ollama_spec.decoding.verify import verify_greedy, verify_rejection, verify_sample_and_compare
from tests.distribution import chisquare_pvalue

SIGNIFICANCE = 0.001  # a correct rule fails these tests once in a thousand seeds; the seeds are fixed


def one_hot_logits(*choices, vocab=6):
    rows = np.zeros((len(choices), vocab))
    for row, choice in zip(rows, choices):
        row[choice] = 5.0
    return rows


def test_greedy_accepts_matching_prefix_then_corrects():
    assert verify_greedy([1, 2, 3], one_hot_logits(1, 2, 4, 0)) == (2, 4)
    assert verify_greedy([1, 2, 3], one_hot_logits(1, 2, 3, 5)) == (3, 5)  # bonus token
    assert verify_greedy([1], one_hot_logits(0, 3)) == (0, 0)
    assert verify_greedy([], one_hot_logits(2)) == (0, 2)


def test_rejection_accepts_everything_when_draft_equals_target():
    rng = np.random.default_rng(0)
    p = np.array([[0.1, 0.2, 0.3, 0.4]] * 4)
    for _ in range(200):
        drafted = [sample(p[0], rng) for _ in range(3)]
        n, _ = verify_rejection(drafted, p[:3], p, rng)
        assert n == 3


def test_rejection_never_accepts_what_the_target_cannot_say():
    rng = np.random.default_rng(1)
    q = np.array([[0.0, 1.0, 0.0, 0.0]])
    p = np.array([[0.5, 0.0, 0.5, 0.0], [0.25] * 4])
    outcomes = {verify_rejection([1], q, p, rng) for _ in range(200)}
    assert outcomes == {(0, 0), (0, 2)}  # always rejected, resampled from p's support


def test_rejection_at_temperature_zero_is_greedy():
    rng = np.random.default_rng(2)
    logits = np.array([[0.1, 3.0, 0.2], [2.0, 0.0, 0.1], [0.0, 0.0, 9.0]])
    greedy = SamplingSettings(temperature=0.0)
    # temperature 0 is the limit of one-hot distributions
    cold = SamplingSettings(temperature=1e-4, top_k=0, top_p=1.0)
    probs = np.stack([logits_to_probs(row, cold) for row in logits])
    for drafted in ([1, 0], [1, 2], [0, 0], [2, 1]):
        greedy_draft = np.eye(3)[drafted]  # a greedy draft puts all its mass on its token
        assert verify_rejection(drafted, greedy_draft, probs, rng) == verify_greedy(drafted, logits)
    assert greedy.greedy


@pytest.mark.parametrize("rule", ["rejection", "sample_and_compare"])
def test_output_distribution_equals_target(rule):
    rng = np.random.default_rng(3)
    q = np.array([0.6, 0.3, 0.05, 0.05])
    p = np.array([0.1, 0.2, 0.3, 0.4])
    counts = np.zeros(4)
    n = 20000
    for _ in range(n):
        x = sample(q, rng)
        if rule == "rejection":
            accepted, nxt = verify_rejection([x], q[None], np.stack([p, p]), rng)
        else:
            accepted, nxt = verify_sample_and_compare([x], np.stack([p, p]), rng)
        counts[x if accepted else nxt] += 1
    assert chisquare_pvalue(counts, p * n) > SIGNIFICANCE


def test_rejection_accepts_more_often_than_sample_and_compare():
    rng = np.random.default_rng(4)
    q = np.array([0.6, 0.3, 0.05, 0.05])
    p = np.array([0.3, 0.3, 0.2, 0.2])
    n = 5000
    rejection = sum(verify_rejection([sample(q, rng)], q[None], np.stack([p, p]), rng)[0] for _ in range(n)) / n
    compare = sum(verify_sample_and_compare([sample(q, rng)], np.stack([p, p]), rng)[0] for _ in range(n)) / n
    assert rejection == pytest.approx(np.minimum(p, q).sum(), abs=0.03)  # 0.75
    assert compare == pytest.approx((p * q).sum(), abs=0.03)  # 0.29
    assert rejection > compare + 0.3


def test_logits_to_probs_transforms():
    logits = np.log(np.array([0.5, 0.25, 0.15, 0.1]))
    assert logits_to_probs(logits, SamplingSettings(temperature=1, top_k=0, top_p=1.0)) == pytest.approx(
        [0.5, 0.25, 0.15, 0.1]
    )
    assert logits_to_probs(logits, SamplingSettings(temperature=1, top_k=2, top_p=1.0)) == pytest.approx(
        [2 / 3, 1 / 3, 0, 0]
    )
    assert logits_to_probs(logits, SamplingSettings(temperature=1, top_k=0, top_p=0.7)) == pytest.approx(
        [2 / 3, 1 / 3, 0, 0]
    )
    assert logits_to_probs(logits, SamplingSettings(temperature=1, top_k=0, top_p=1.0, min_p=0.3)) == pytest.approx(
        [0.5 / 0.9, 0.25 / 0.9, 0.15 / 0.9, 0]
    )
    hot = logits_to_probs(logits, SamplingSettings(temperature=2, top_k=0, top_p=1.0))
    assert hot[0] < 0.5 and hot.sum() == pytest.approx(1)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"temperature": -0.1}, "temperature must be >= 0, got -0.1"),
        ({"top_p": 0.0}, "top-p must be in (0, 1], got 0.0"),
        ({"top_p": 1.5}, "top-p must be in (0, 1], got 1.5"),
        ({"top_k": -1}, "top-k must be >= 0 (0 turns it off), got -1"),
        ({"min_p": 2.0}, "min-p must be in [0, 1], got 2.0"),
    ],
)
def test_invalid_sampling_settings(kwargs, message):
    from ollama_spec.errors import InvalidSetting

    with pytest.raises(InvalidSetting) as err:
        SamplingSettings(**kwargs)
    assert str(err.value) == message


def test_draft_distribution_narrower_than_the_target_has_zero_mass_on_the_extra_ids():
    """A draft vocabulary without the target's padding: ids past q's end are q = 0, so the
    residual max(0, p - q) keeps all of p there and the output is still distributed as p."""
    rng = np.random.default_rng(4)
    q = np.array([0.7, 0.3])
    p = np.array([0.2, 0.3, 0.5])  # the third id exists only in the target
    n = 20000
    outputs = []
    for _ in range(n):
        drafted = sample(q, rng)
        accepted, token = verify_rejection([drafted], q[None], np.stack([p, p]), rng)
        outputs.append(drafted if accepted else token)
    observed = np.bincount(outputs, minlength=3)
    assert chisquare_pvalue(observed, p * n) > SIGNIFICANCE


@pytest.mark.parametrize("seed", [-1, -12345])
def test_a_negative_seed_means_random(seed):
    assert SamplingSettings(seed=seed).seed is None
    assert SamplingSettings(seed=7).seed == 7


def test_one_hot_proposals_keep_the_target_distribution():
    """n-gram lookup proposes with certainty (draft_probs None): accept x with probability p(x),
    else sample from p without x."""
    rng = np.random.default_rng(5)
    p = np.array([0.1, 0.6, 0.3])
    n = 20000
    outputs = []
    for i in range(n):
        proposed = i % 3  # whatever is proposed, the output must follow p
        accepted, token = verify_rejection([proposed], None, np.stack([p, p]), rng)
        outputs.append(proposed if accepted else token)
    assert chisquare_pvalue(np.bincount(outputs, minlength=3), p * n) > SIGNIFICANCE
