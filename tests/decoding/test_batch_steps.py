"""K for the batch's step: a slot's drafts priced against what the slots batched with it yield and cost."""

import gc

from ollama_spec.decoding.batch_steps import BatchSteps
from ollama_spec.decoding.k_policy import AutoK
from ollama_spec.decoding.step_costs import ALONE, Beside, StepCosts, beats_target_alone, best_drafting_k

# a slot's own part of the batches: a draft step, and its tokens' part of a verify pass
OWN = StepCosts(draft_step_s=0.1, verify_s=tuple(1.0 + 0.1 * n for n in range(9)))


class Steady:
    """Another slot whose steps yield `tokens` in `seconds` (its part of each)."""

    def __init__(self, tokens: float, seconds: float):
        self.tokens, self.seconds = tokens, seconds

    def per_step(self) -> tuple[float, float]:
        return self.tokens, self.seconds


def script(policy: AutoK, steps: int = 60) -> list[int]:
    """The Ks a policy picks over steps that accept half their drafts."""
    ks = []
    for _ in range(steps):
        k = policy.next_k()
        ks.append(k)
        policy.observe(k, k // 2, 0.1 * k, 1.0 + 0.1 * k)
    return ks


def test_a_slot_alone_in_a_batch_chooses_as_a_lone_request_does():
    batch = BatchSteps()
    lone, batched = AutoK(OWN, 0.6), AutoK(OWN, 0.6, batch=batch)
    ks = script(lone)
    assert ks == script(batched) and len(batch) == 1
    assert 0 < sum(ks) < 8 * len(ks)  # it chose, and not one K throughout


def test_a_weak_draft_drafts_nothing_beside_slots_that_make_tokens_faster():
    alphas = [0.5] * 8
    # alone, one token at α=0.5 pays: 1.5 tokens in 1.2 s against 1 in 1.0 s
    k, rate = best_drafting_k(alphas, OWN)
    assert k >= 1 and beats_target_alone(rate, OWN, 0.1)
    # beside slots making 4 tokens in 1 s of the step, the same token adds 0.5 in 0.2 s: the batch's rate
    beside = Beside(tokens=4.0, seconds=1.0)
    k, rate = best_drafting_k(alphas, OWN, beside)
    assert not beats_target_alone(rate, OWN, 0.0, beside)

    batch = BatchSteps()
    other = Steady(4.0, 1.0)
    batch.join(other)
    weak = AutoK(OWN, 0.5, batch=batch)
    assert weak.next_k() == 0
    batch.leave(other)
    assert AutoK(OWN, 0.5, batch=batch).next_k() >= 1  # once alone, it drafts again


def test_a_good_draft_keeps_drafting_beside_slots_that_make_tokens_slower():
    batch = BatchSteps()
    batch.join(Steady(1.0, 1.0))
    assert AutoK(OWN, 0.9, batch=batch).next_k() >= 1


def test_a_further_token_must_beat_the_rate_of_the_whole_batch():
    batch = BatchSteps()
    policy = AutoK(OWN, 0.6, batch=batch)
    policy.next_k()
    alone = policy.rate
    fast = Steady(8.0, 1.0)
    batch.join(fast)
    policy.next_k()
    tokens, seconds = policy.per_step()
    assert policy.rate == (8.0 + tokens) / (1.0 + seconds) > alone


def test_policies_leave_when_their_request_ends_or_is_dropped():
    batch = BatchSteps()
    one, two = AutoK(OWN, batch=batch), AutoK(OWN, batch=batch)
    assert batch.beside(one) != ALONE and len(batch) == 2
    one.leave()
    assert batch.beside(two) == ALONE
    del two  # a request that failed before it could leave
    gc.collect()
    assert len(batch) == 0
