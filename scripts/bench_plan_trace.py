"""`ollama-spec bench ...` with the batch's plans traced: one JSON line per plan_step of the step loop.

Each line: the slots planned for ("n"), the K planned ("k"), the margin it had to beat, the slots' mean
acceptance at positions 1-3 ("alpha"), the steps each slot has seen ("obs"), and the prices the plan
read: the target's pass over n·(1..4) tokens ("t", µs) and the draft's over n rows ("d", µs). With
CPU_CLOCK=1 every timer reads the process's CPU time instead of the wall clock (less moved by other
work on a shared machine; it adds the clients' threads' CPU to the loop's). CLIENTS picks the client
counts, as in scripts/bench_sim_clock.py.

    OLLAMA_MODELS=demo-models TRACE=plans.jsonl CLIENTS=8 PYTHONPATH=. python scripts/bench_plan_trace.py \\
        bench tiny-target -d tiny-draft --concurrency 8 --in-process --max-tokens 64 --ctx 512 --threads 1 -k auto,1
"""

from __future__ import annotations

import json
import os
import sys
import time

if os.environ.get("CPU_CLOCK"):
    time.perf_counter = time.process_time
    import ollama_spec.llama.model as llama_model

    llama_model.perf_counter = time.process_time

from ollama_spec.cli import bench_local, main  # after the clock is chosen
from ollama_spec.decoding import batch_steps
from ollama_spec.engine import batch_k


def trace(path: str) -> None:
    """One JSON line per plan (see the module)."""
    out = open(path, "w")  # noqa: SIM115 - open until the process ends
    plan_step = batch_k.plan_step

    def traced(members, prices, margin, k_max):
        planned = plan_step(members, prices, margin, k_max)
        n, acceptances = len(members), batch_steps.acceptances(members)
        record = {
            "n": n,
            "k": planned[0],
            "margin": margin,
            "alpha": [round(sum(a[i] for a in acceptances) / n, 3) for i in range(min(3, k_max))],
            "obs": [member.observed for member in members],
            "t": [round(prices.target_pass(n * (width + 1)) * 1e6) for width in range(4)],
            "d": round(prices.draft_pass(n) * 1e6),
        }
        out.write(json.dumps(record) + "\n")
        return planned

    batch_k.plan_step = traced


if __name__ == "__main__":
    if "CLIENTS" in os.environ:
        counts = [int(n) for n in os.environ["CLIENTS"].split()]
        bench_local.client_counts = lambda most: counts
    trace(os.environ.get("TRACE", "plans.jsonl"))
    sys.argv = ["ollama-spec", *sys.argv[1:]]
    main()
