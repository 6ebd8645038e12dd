"""The K policies' seam: what the draft-verify loop asks of one (`KPolicy`), and the simplest, a fixed K.

`k_policy.AutoK` is the other: K chosen each step from the measured costs and the live acceptance.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from ollama_spec.decoding.step_costs import worth_a_token


class KPolicy(Protocol):
    """What the loop asks before each step and tells after it.

    `keep_drafting(drafted, margin)`, where a policy has one, is asked before each drafted token
    (None: always draft K, and the proposer need not work out margins)."""

    keep_drafting: Callable[[int, float | None], bool] | None
    # this step drafts only to see whether drafting pays again (after K=0 steps): PROBE_ACCEPTANCE or
    # PROBE_COSTS, what the probe asks; "" on other steps
    probing: str
    # after next_k chose K=0: how many steps, this one included, will draft nothing whatever happens
    # (0: unknown)
    quiet_steps: int

    def next_k(self) -> int: ...
    # a step at K=0 with a prompt lookup's match: how many of its tokens to verify, given each one's
    # acceptance (the chance that position i is accepted given those before it were)
    def lookup_worth(self, alphas: Sequence[float]) -> int: ...
    # lookup: the step's tokens came from a source free to propose (prompt lookup), not the draft model
    def observe(
        self, drafted: int, accepted: int, draft_s: float, verify_s: float, *, lookup: bool = False
    ) -> None: ...


@dataclass
class FixedK:
    k: int
    keep_drafting = None  # every step drafts k
    probing = ""  # never probes
    quiet_steps = 0  # none promised

    def next_k(self) -> int:
        return self.k

    @staticmethod
    def lookup_worth(alphas: Sequence[float]) -> int:
        return worth_a_token(alphas)

    def observe(self, drafted: int, accepted: int, draft_s: float, verify_s: float, *, lookup: bool = False) -> None:
        pass
