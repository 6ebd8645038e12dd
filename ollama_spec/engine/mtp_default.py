"""A target's own MTP (NextN) layers as its default drafter, kept only where their priced goodput beats the
target alone.

Where no draft is named and the target carries NextN layers, the engine loads them (engine/pairing.py), then
prices them as -k auto does: this machine's step costs (the NextN layer's draft step, each verify batch, as
calibrated once per pair and setup) at the acceptance published for MTP. If no K ≥ 1 is expected to give
more tokens per second than the target alone, the layers are let go and the target runs alone; where some
K pays, -k auto still chooses each step's K from the acceptance it measures, K=0 included. Where the
target fits and its MTP layers beside it do not, they are let go before anything loads (`let_mtp_go`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from ollama_spec.decoding.loop import DEFAULT_MAX_SPECULATIVE_TOKENS
from ollama_spec.decoding.step_costs import best_k


def let_mtp_go(settings, refused: Exception, notice: Callable[[str], None]):
    """`settings` (engine.EngineSettings) without the MTP layers chosen by default, which do not fit beside
    the target (`refused`: the plan's InsufficientMemory), said to `notice` and kept as `mtp_let_go`; the
    refusal itself where they were named, or are not loaded."""
    if not (settings.mtp and settings.mtp_where_it_pays):
        raise refused
    reason = f"do not fit beside it ({refused})"
    notice(f"the target's MTP layers {reason}: the target runs alone")
    return replace(settings, mtp=False, mtp_where_it_pays=False, mtp_let_go=f"its MTP layers {reason}")


# MTP layers in llama.cpp (PR #22673): about 75 % of drafts accepted at 3 drafts per step
MTP_PRIOR_ALPHA = 0.75


def keep_mtp_where_it_pays(engine) -> bool:
    """Keep the MTP head of `engine` (an engine.Engine, loaded with it) where some K ≥ 1 is priced above the
    target alone at MTP_PRIOR_ALPHA; else let it go, say so and keep why in its settings (`mtp_let_go`): the
    target drafts with nothing. Whether it was kept."""
    costs = engine.costs.calibrated(engine.costs.draft, DEFAULT_MAX_SPECULATIVE_TOKENS)
    if best_k(MTP_PRIOR_ALPHA, costs) > 0:
        return True
    reason = (
        f"would not pay on this machine (a draft step costs {costs.draft_step_s * 1e3:.2f} ms beside a target "
        f"step of {costs.verify_s[0] * 1e3:.2f} ms)"
    )
    engine.notice(f"the target's MTP layers {reason}: the target runs alone")
    engine.head.close()
    engine.head, engine.costs.draft = None, None
    engine.settings = replace(engine.settings, mtp=False, mtp_let_go=f"its MTP layers {reason}")
    return False
