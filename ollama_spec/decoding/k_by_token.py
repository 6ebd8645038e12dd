"""How deep a draft goes token by token: `AutoK`'s rule where a draft step costs far more than weighing
a token (a draft model reports each token's margin, p1 − p2; decoding/k_policy.py).

The draft keeps going while the next token, at the acceptance its margin has earned so far, still pays
for its draft step and its place in the verify batch at the rate the steps achieve, up to K_max: long
drafts through easy text, short ones where the draft hesitates. A draft step cheaper than weighing a
token (STOPS_MIN_DRAFT_S, k_tuning) drafts the K the policy chose whole instead.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ollama_spec.decoding.acceptance import AcceptanceByMargin
from ollama_spec.decoding.step_costs import StepCosts, free_next, run_pays


class WeighsTokens:
    """`AutoK`'s token-by-token rule (`decide`), over the state AutoK keeps for it: set before each step
    (AutoK.next_k), read after it (AutoK.observe: the margins of the tokens drafted)."""

    confidence_stops: bool
    stops_min_draft_s: float
    costs: StepCosts
    rate: float
    by_margin: AcceptanceByMargin
    shared_k: int | None
    survivals: list[float]  # beside others: the chance that all of this step's drafts so far are accepted
    alphas: Callable[[], list[float]]
    _calibrated: Sequence[float]  # verify seconds by size as timed (free_next reads their bumps)
    _by_token: bool  # this policy weighs tokens now (`weighs_tokens` at its costs)
    _stopping: bool  # this step drafts token by token
    _explore: str  # "armed", "take", "done": a step going one token past the margins' stop; "": none
    _draft_steps: int
    _margins: list[float]
    _survival: float

    def weighs_tokens(self, costs: StepCosts) -> bool:
        """Token by token, where a draft step costs far more than weighing a token (stops_min_draft_s)."""
        return self.confidence_stops and costs.draft_step_s >= self.stops_min_draft_s

    @property
    def keep_drafting(self) -> Callable[[int, float | None], bool] | None:
        """`decide`, asked before each drafted token (KPolicy); None where a policy with confidence stops drafts the K
        chosen this step (a draft step too cheap to weigh each token: weighs_tokens), beside other slots too."""
        return None if self.confidence_stops and not self._by_token else self.decide

    def decide(self, drafted: int, margin: float | None) -> bool:
        """After `drafted` tokens this step: take the next one, whose margin is `margin`? Or, with
        margin None, run the draft step that shows the next token and its margin?

        Yes when that token and some run of tokens after it (at the average α) add expected tokens
        faster than the steps' rate, counting their places in the verify batch and the draft steps
        still to run (a token whose margin is known has had its own).
        """
        if not self._stopping:
            if margin is None:
                self._draft_steps += 1
            else:
                self._margins.append(margin)
                if self.shared_k:  # beside others: the step loop decides from every slot's survival
                    self._survival *= self.by_margin.alpha(margin)
                    self.survivals.append(self._survival)
            return True
        if self._explore == "done":
            return False
        if self._explore == "take":  # the token an exploring draft step was run for
            self._explore = "done"
            worth = True
        else:  # the next token: its draft step still to run (margin None), or run
            first_gain = self._survival if margin is None else self._survival * self.by_margin.alpha(margin)
            worth = run_pays(self.costs, self.alphas(), self.rate, drafted, first_gain, int(margin is None))
        if not worth and margin is not None and free_next(self._calibrated, drafted):
            worth = True
        if not worth and self._explore == "armed":  # one token past the stop, and no further: that batch is timed
            self._explore, worth = ("take" if margin is None else "done"), True
        if worth and margin is None:
            self._draft_steps += 1
        elif worth:
            self._margins.append(margin)
            self._survival *= self.by_margin.alpha(margin)
        return worth
