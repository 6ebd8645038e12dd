"""One K for every slot of a batch step, priced by what the step costs the whole batch.

With B slots in one step (engine/step_loop.py), a step is D draft passes of every slot that drafts, then one
target pass over every slot's tokens. And the target's pass is laid out by llama/passes.py so that
each row gets the kernels it gets alone: every sequence in it brings as many tokens as the widest
one, padding made up after its own. So a slot's drafts below the widest slot's are free in the
verify pass (they take the place of padding), and a slot drafting past the others makes every
slot pay a padded column. Per-slot policies priced as if alone got this wrong both ways: at 4
clients on the demo pair `-k auto` made 57 tok/s where a fixed K=4 made 70.

So beside other slots the K of a step is one for all of them: the K that maximises

    Σ_slots E_i(K) / (K · t_draft(B) + t_verify(B · (K + 1))),

with E_i each slot's expected tokens at its own acceptance by position, t_verify the target's pass
over that many tokens and t_draft the draft's over B rows, as the step loop's own passes timed them
(decoding/pass_prices.py; a calibration is only their prior). K = 0 unless it beats the target alone by the margin.
A verify pass is priced at the tokens it computes: where each sequence brings `least_width` tokens at
least (the target's rows exact without flash attention: two, llama/passes.py), the target alone's pass
of B tokens costs what one of 2B does, the one of K=1. Priced at B tokens instead, the tiny pair's
batch planned K=0 at 9 steps in 10 at 2-4 slots, where a fixed K=1 made 1.3x its tokens.
A slot alone has nothing to share a step with: with B = 1 this is the single-slot rule
(step_costs.best_drafting_k), which a lone AutoK refines token by token by the draft's margins.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from ollama_spec.decoding.pass_prices import PassPrices, pass_seconds  # noqa: F401 - callers take it from here
from ollama_spec.decoding.step_costs import StepCosts

# A slot's own acceptance counts in the batch's K once it has seen this many steps; before, it takes
# the others' mean. With 8 clients of 64 tokens a request, a slot starts afresh every ~25 steps, and a
# fresh policy's prior (α 0.7 at every position) drew every slot's K deeper than its own text pays.
SEASONED_STEPS = 8
# After a draft pass, `further` looks this many columns ahead: a column that does not pay alone may pay
# with the ones after it (each draft pass costs a fixed part that the later columns share).
LOOKAHEAD = 4


class Slot(Protocol):
    observed: int  # steps seen

    def alphas(self) -> list[float]:
        """Each position's acceptance, given the ones before it were accepted."""
        ...


class Drafting(Protocol):
    # the chance that all of this step's drafts so far are accepted, after 0, 1, 2 ... of them
    survivals: list[float]

    def alphas(self) -> list[float]: ...


def step_k(members: Sequence[Slot], prices: StepCosts | PassPrices, margin: float, k_max: int) -> int:
    """The one K for the next step of the slots whose policies are `members` (see the module)."""
    return plan_step(members, prices, margin, k_max)[0]


def plan_step(
    members: Sequence[Slot],
    prices: StepCosts | PassPrices,
    margin: float,
    k_max: int,
    least_width: int = 1,
    reshape_s: float = 0.0,
) -> tuple[int, float]:
    """step_k, and the tokens per second a step at that K is expected to make (0.0 at K=0); `reshape_s`:
    what each of a step's two draft passes of another shape costs more at K >= 2 (pass_line.RESHAPED)."""
    return _best_shared(acceptances(members), prices, margin, k_max, least_width, reshape_s)


def acceptances(members: Sequence[Slot]) -> list[list[float]]:
    """Each slot's acceptance by position; a slot that has seen too few steps takes the others' mean."""
    own = [m.alphas() for m in members]
    seasoned = [alphas for m, alphas in zip(members, own) if m.observed >= SEASONED_STEPS]
    if not seasoned:
        return own
    mean = [sum(column) / len(column) for column in zip(*seasoned)]
    return [alphas if m.observed >= SEASONED_STEPS else mean for m, alphas in zip(members, own)]


def best_shared_k(
    alphas: Sequence[Sequence[float]],
    prices: StepCosts | PassPrices,
    margin: float,
    k_max: int | None = None,
    least_width: int = 1,
) -> int:
    """The one K (up to `k_max`, else the calibration's) for slots with these acceptances by position
    (the module's rule), priced by the passes as learned, or by calibrated one-sequence costs."""
    return _best_shared(alphas, prices, margin, k_max, least_width)[0]


def _best_shared(
    alphas: Sequence[Sequence[float]],
    prices: StepCosts | PassPrices,
    margin: float,
    k_max: int | None,
    least_width: int = 1,
    reshape_s: float = 0.0,
) -> tuple[int, float]:
    if isinstance(prices, StepCosts):
        k_max = prices.k_max if k_max is None else min(k_max, prices.k_max)
        prices = PassPrices(prior=prices)
    slots = len(alphas)
    k_max = min([k_max or 0, *map(len, alphas)])
    # Σ over the slots of each one's expected tokens at K (step_costs.expected_tokens_for_each_k), a column
    # at a time: the search mostly stops a few columns in, and the step loop asks at every step
    expected, survivals = [float(slots)], [1.0] * slots
    alone = prices.target_pass(slots * least_width)
    best, best_rate, draft = 0, expected[0] / alone, prices.draft_pass(slots)
    for k in range(1, k_max + 1):
        survivals = [survival * slot[k - 1] for survival, slot in zip(survivals, alphas)]
        expected.append(expected[-1] + sum(survivals))
        seconds = k * draft + prices.target_pass(slots * max(k + 1, least_width)) + (2 * reshape_s if k > 1 else 0.0)
        rate = expected[k] / seconds
        if rate > best_rate:
            best, best_rate = k, rate
        # each later column adds at most this one's tokens (acceptance only falls along a draft) and a
        # draft pass at least: where even that cannot beat the best, no deeper K can (the step loop asks
        # often; most of k_max's sizes are priced from the prior, ~2 us each on the tiny pair)
        elif expected[k] + (k_max - k) * (expected[k] - expected[k - 1]) < best_rate * (seconds + (k_max - k) * draft):
            break
    return (best, best_rate) if best_rate >= (1 + margin) * expected[0] / alone else (0, 0.0)


def further(
    members: Sequence[Drafting],
    prices: PassPrices,
    rows: int,
    draft_rows: int,
    rate: float,
    cap: int,
    least_width: int = 1,
) -> int | None:
    """After a draft pass that gave each of `members` (slots drafting beside each other) its next token:
    None to run the next draft pass, else how many of the drafted columns the verify pass takes.

    Each step adds tokens and costs seconds; the steps make the most tokens per second when each step
    makes the most of tokens − `rate` × seconds, `rate` being what the steps make (Σ expected tokens ÷
    the step's time at the planned K). The columns drafted so far are known by their margins (each
    member's `survivals`); the ones after them by each slot's acceptance by position. So the batch drafts
    on while some run of further columns (their draft passes and their rows in the verify pass of
    `rows` sequences) adds more than it costs at that rate, and verifies the drafted columns that pay:
    deep through easy text, shallow where the drafts hesitate, one depth for every slot."""
    survivals = [member.survivals for member in members]
    depth = min(map(len, survivals)) - 1
    best, best_value, total = 0, -rate * prices.target_pass(rows * least_width), 0.0
    for width in range(1, depth + 1):
        total += sum(survival[width] for survival in survivals)
        value = total - rate * prices.target_pass(rows * (width + 1))
        if value > best_value:
            best, best_value = width, value
    if depth >= cap:
        return best
    alphas = [member.alphas() for member in members]
    tail, draft = [survival[depth] for survival in survivals], prices.draft_pass(draft_rows)
    for more in range(1, min(LOOKAHEAD, cap - depth) + 1):
        position = depth + more - 1
        for i, slot in enumerate(alphas):
            tail[i] *= slot[position] if position < len(slot) else 0.0
        total += sum(tail)
        if total - rate * (more * draft + prices.target_pass(rows * (depth + more + 1))) > best_value:
            return None
    return best
