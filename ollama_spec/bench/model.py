"""Leviathan et al. (2023)'s model of speculative decoding, with measured costs.

With α the probability that a tried draft token is accepted (each independently), a step
that drafts K tokens emits (1 - α^(K+1)) / (1 - α) tokens on average. It costs K draft steps
plus one verify batch of K+1 tokens; the target alone pays one target step per token. In units
of a target step, c = draft step / target step and v_K = verify(K+1) / target step, so

    predicted speed-up = (1 - α^(K+1)) / ((1 - α) * (K*c + v_K)).

α is accepted / tried (step_costs.estimate_alpha), not accepted / drafted: the drafts after a
rejection are never tried, so the acceptance rate understates α more as K grows.

The paper assumes v_K = 1 (a batch costs one step, true when memory-bound); on a CPU it does not,
so v_K is measured.
"""

from __future__ import annotations

from ollama_spec.decoding.step_costs import expected_tokens_per_step

__all__ = ["efficiency", "expected_tokens_per_step", "predicted_speedup", "predicted_speedup_from_step_length"]


def predicted_speedup(acceptance: float, k: int, draft_cost: float, verify_cost: float) -> float:
    """Predicted speed-up over the target alone.

    draft_cost = draft step / target step (c); verify_cost = verify batch of k+1 / target step (v_K).
    """
    if draft_cost < 0 or verify_cost <= 0:
        raise ValueError("costs must be positive")
    return expected_tokens_per_step(acceptance, k) / (k * draft_cost + verify_cost)


def predicted_speedup_from_step_length(tokens_per_step: float, k: int, draft_cost: float, verify_cost: float) -> float:
    """The same cost model fed the measured tokens per step instead of the i.i.d. estimate.

    Real acceptance comes in runs (easy stretches accept everything), so the geometric sum can
    under-estimate tokens per step; this variant isolates the loop's own overhead.
    """
    if draft_cost < 0 or verify_cost <= 0:
        raise ValueError("costs must be positive")
    return tokens_per_step / (k * draft_cost + verify_cost)


def efficiency(measured_speedup: float, predicted: float) -> float:
    """How much of the predicted speed-up the implementation delivers (1.0: all of it)."""
    return measured_speedup / predicted if predicted > 0 else 0.0
