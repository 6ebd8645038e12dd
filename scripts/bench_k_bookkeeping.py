"""What `-k auto` costs a lone step in Python outside llama.cpp: the pass prices told a step's passes, the
step loop's choice (engine/batch_k.py), the policy's next_k and observe, on a fixed script of steps
shaped like the tiny pair's (target 110 us + 20 us a token, draft 45 us, acceptance 0.85), without
llama.cpp. On a pair whose steps take a fraction of a millisecond (the tiny pair; a GPU's) this is a
share of every step that a fixed K does not pay.

    PYTHONPATH=. python scripts/bench_k_bookkeeping.py          # thread CPU us a step, 5 rounds
    STEPS=5001 PYTHONHASHSEED=0 PYTHONPATH=. setarch -R valgrind --tool=callgrind python scripts/bench_k_bookkeeping.py
        # instructions, whatever the machine's load: subtract a STEPS=1001 run's, divide by 4000 (without
        # PYTHONHASHSEED two runs of the same code differed by 20 %, without setarch -R by ±8k a step)
    SLOTS=8 ...  # the same for 8 slots beside each other: the plan, every slot's next_k and observe
        # (draft 20 us + 2 us a row, target 110 us + 5 us a token: the plan drafts)

Thread CPU time still moves 1.5x on a busy 2-core VM; the instruction count does not.
"""

import os
import random
import time
from types import SimpleNamespace

from ollama_spec.decoding.k_policy import AutoK
from ollama_spec.decoding.pass_prices import PassPrices
from ollama_spec.decoding.step_costs import StepCosts
from ollama_spec.engine.batch_k import BatchK

US = 1e-6
MODEL = StepCosts(40 * US, tuple((110 + 20 * n) * US for n in range(17)))


def run(steps: int = 3000, seed: int = 0) -> float:
    """Thread CPU seconds a step of `steps` lone steps' bookkeeping, in microseconds. The step loop's clock
    is the script's (each pass's seconds, and 30 us of Python a step): its pricing waits then come as on
    the pair, not as the machine (or valgrind's ~50x slower run) makes them."""
    rng, now = random.Random(seed), [0.0]
    prices = PassPrices(prior=MODEL)
    choice = BatchK(prices, clock=lambda: now[0])
    policy = AutoK(MODEL, 0.85, confidence_stops=True)
    generation = SimpleNamespace(policy=policy, shared=False)
    started = time.thread_time()
    for _ in range(steps):
        choice.choose([generation])
        k = policy.next_k()
        for _ in range(k):
            seconds = 45 * US * rng.uniform(0.95, 1.3)
            now[0] += seconds
            prices.observe(True, 1, seconds)
            choice.observe(True, 1, seconds)
        seconds = (110 + 20 * (k + 1)) * US * rng.uniform(0.95, 1.3)
        now[0] += seconds + 30 * US
        prices.observe(False, k + 1, seconds)
        choice.observe(False, k + 1, seconds)
        accepted = next((i for i in range(k) if rng.random() > 0.85), k)
        policy.observe(k, accepted, 45 * US * k, seconds + (60 * US if k >= 2 else 0))
    return (time.thread_time() - started) / max(steps, 1) * 1e6


def run_beside(steps: int, slots: int, seed: int = 0) -> float:
    """Thread CPU seconds a step of `steps` steps of `slots` slots beside each other, in microseconds."""
    rng, now = random.Random(seed), [0.0]
    prices = PassPrices(prior=MODEL)
    choice = BatchK(prices, clock=lambda: now[0])
    generations = [
        SimpleNamespace(policy=AutoK(MODEL, 0.85, confidence_stops=True), shared=False) for _ in range(slots)
    ]
    ks = [generation.policy.next_k() for generation in generations]
    started = time.thread_time()
    for _ in range(steps):
        for _ in range(max(ks)):
            seconds = (20 + 2 * slots) * US * rng.uniform(0.95, 1.3)
            now[0] += seconds
            prices.observe(True, slots, seconds)
            choice.observe(True, slots, seconds, slots)
        choice.choose(generations)
        tokens = slots * (max(ks) + 1)
        seconds = (110 + 5 * tokens) * US * rng.uniform(0.95, 1.3)
        now[0] += seconds
        prices.observe(False, tokens, seconds)
        choice.observe(False, tokens, seconds, slots)
        for generation, k in zip(generations, ks):
            accepted = next((i for i in range(k) if rng.random() > 0.85), k)
            generation.policy.observe(k, accepted, 45 * US * k, seconds)
        ks = [generation.policy.next_k() for generation in generations]
    return (time.thread_time() - started) / max(steps, 1) * 1e6


if __name__ == "__main__":
    slots = int(os.environ.get("SLOTS", "1"))
    one = run if slots == 1 else lambda steps=3000: run_beside(steps, slots)
    if "STEPS" in os.environ:
        one(int(os.environ["STEPS"]))
    else:
        rounds = [one() for _ in range(5)]
        print(f"{min(rounds):.1f} us a step (rounds: {' '.join(f'{r:.1f}' for r in rounds)})")
