"""`ollama-spec bench ...` with each step loop turn of a lone slot timed and sorted: where `-k auto`'s time
goes against a fixed K's, turn by turn.

A turn of a lone `-k auto` slot is sorted by what its rule did in it: `held` (its K stood, the step held:
decoding/k_steady.py), `end` (a stand ended and its held steps were taken in), `price` (the step loop priced
it again: engine/batch_k.py), `plain` (none of those), with the K it drafted and `/probe` for a probe's
step. A fixed K's turns are one class. Each class prints its count, median and mean turn, and its share of
the row's time in turns; the totals say how much more time the auto row spent in its turns. Run one auto
row beside one fixed row (two auto rows in one process share the pass prices: compare processes):

    OLLAMA_MODELS=demo-models PYTHONPATH=. python scripts/bench_turns.py bench tiny-target -d tiny-draft \\
        --concurrency 1 --in-process -k auto,1 --runs 8 --max-tokens 96 --threads 1 --ctx 512

On the tiny pair (2026-12-05) a held K=1 turn took what a fixed K=1 turn did (median 290-340 us both),
and the auto row's extra time was in its stand ends (+60 us each, ~40 a process), its pricings (+180 us
each, ~80 a process, 49 of them after each request's prompt step until 61fee5e) and its other Ks.
"""

from __future__ import annotations

import atexit
import statistics
import sys
import time
from collections import defaultdict

from ollama_spec.cli import main
from ollama_spec.decoding import k_policy, k_steady, loop
from ollama_spec.engine import step_loop

turns: dict[tuple[str, int | str, str], list[float]] = defaultdict(list)
happened: set[str] = set()  # what the rule did in the turn under way
step = {"drafted": 0, "first": False}  # the last step recorded: its drafts, and whether it read a prompt


def _noting(function, what: str, when=lambda result: True):
    def noted(*args, **kwargs):
        result = function(*args, **kwargs)
        if when(result):
            happened.add(what)
        return result

    return noted


k_steady.SteadyK.settle = _noting(k_steady.SteadyK.settle, "end", when=bool)  # held steps taken in
k_policy.AutoK.reprice = _noting(k_policy.AutoK.reprice, "price")
_record = loop._record


def _recorded(stats, policy, proposer, first, n_drafted, *rest) -> None:
    step["drafted"], step["first"] = n_drafted, first
    _record(stats, policy, proposer, first, n_drafted, *rest)


loop._record = _recorded
_turn = step_loop.StepLoop.turn


def _timed_turn(self) -> None:
    slots = list(self._slots.values())
    policy = slots[0].ticket.generation.policy if len(slots) == 1 else None
    happened.clear()
    steps, started = self.steps, time.perf_counter()
    _turn(self)
    seconds = time.perf_counter() - started
    if policy is None or self.steps != steps + 1:  # beside others, or no step ended in it
        return
    drafted = "prompt" if step["first"] else step["drafted"]
    if isinstance(policy, k_policy.AutoK):
        standing = policy._steady.k or policy._steady._held
        kind = "+".join(sorted(happened)) or ("held" if standing else "plain")
        turns[("auto", drafted, kind + ("/probe" if policy.probing else ""))].append(seconds)
    else:
        turns[("fixed", drafted, "")].append(seconds)


def _report() -> None:
    total = defaultdict(float)
    for (row, _, _), seconds in turns.items():
        total[row] += sum(seconds)
    for (row, k, kind), seconds in sorted(turns.items(), key=str):
        if len(seconds) >= 5:
            print(
                f"{row:<5} K={k!s:<6} {kind:<16} {len(seconds):>6} turns  median {statistics.median(seconds) * 1e6:7.1f} us"
                f"  mean {statistics.mean(seconds) * 1e6:7.1f} us  {sum(seconds) / total[row]:6.1%} of the row's",
                file=sys.stderr,
            )
    for row, seconds in total.items():
        count = sum(len(s) for (r, _, _), s in turns.items() if r == row)
        print(f"{row:<5} {count} turns, {seconds:.3f} s in all", file=sys.stderr)


step_loop.StepLoop.turn = _timed_turn
atexit.register(_report)

if __name__ == "__main__":
    sys.argv = ["ollama-spec", *sys.argv[1:]]
    main()
