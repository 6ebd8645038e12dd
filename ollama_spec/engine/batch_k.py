"""The K of the step loop's steps: planned for every slot before the target pass, and where drafting
beside each other stops.

Beside other slots one K is planned for all of them (decoding/batch_steps.plan_step: goodput over
every slot's acceptance by position, priced by the passes as timed), every slot drafts as deep as the
others up to DEEPER columns past it, and after each draft pass `stop` says whether the batch drafts on
(batch_steps.further: the drafts so far by their margins, at the rate the planned K makes). A slot
alone keeps its own rule, token by token, priced by the same passes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ollama_spec.decoding.batch_steps import further, plan_step
from ollama_spec.decoding.k_policy import DRAFT_GAIN_MARGIN, AutoK
from ollama_spec.decoding.pass_prices import PassPrices

# Beside other slots, the batch drafts at most this many columns past the K planned from acceptance by
# position: deeper where every slot's drafts so far are sure (replayed on the demo pair's greedy texts
# in modelled time, a cap of K+2 made 2-4 % fewer tokens a second than none below k_max).
DEEPER = 16
# A lone slot priced again from the passes (at each of its first steps too): ~50 us; a price follows ~10
REPRICE_EVERY = 4


@dataclass
class BatchK:
    """The step loop's choice of K over `prices`, the passes as its loop timed them."""

    prices: PassPrices
    rate: float = 0.0  # tokens per second the planned K makes: what a further draft column must beat

    def choose(self, generations: Sequence[Any]) -> None:
        """Before the target pass: the next step's K for every generation running (see the module)."""
        policies = [g.policy for g in generations if isinstance(g.policy, AutoK) and g.policy.learn_costs]
        prices, shared = self.prices, len(generations) > 1
        if not policies or not prices.known:
            k = None
        elif shared:
            k_max = min(p.costs.k_max for p in policies)
            k, self.rate = plan_step(policies, prices, DRAFT_GAIN_MARGIN, k_max)
            k = k and min(k + DEEPER, k_max)
        else:
            k, lone = None, policies[0]
            if lone.observed < REPRICE_EVERY or lone.observed % REPRICE_EVERY == 0:
                lone.reprice(prices.step_costs(lone.costs.k_max, drafts=lone.confidence_stops))
        for policy in policies:
            policy.shared_k = k
        for generation in generations:
            generation.shared |= shared

    def stop(self, policies: Sequence[Any], rows: int, draft_rows: int) -> int | None:
        """Before a draft pass of `draft_rows` slots: None to run it, else how many columns the slots
        drafting beside each other (`policies`: each `drafting_beside`) have the verify pass of `rows`
        sequences take, their drafting stopped."""
        cap = min(policy.shared_k for policy in policies)
        return further(policies, self.prices, rows, draft_rows, self.rate, cap)


def drafting_beside(policy: Any) -> bool:
    """Is this a slot's policy drafting the batch's columns, one drafted this step at least (its next
    draft pass the one `BatchK.stop` may stop)?"""
    return isinstance(policy, AutoK) and bool(policy.shared_k) and len(policy.survivals) > 1
