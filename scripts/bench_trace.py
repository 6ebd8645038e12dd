"""`ollama-spec bench ...` on the real clock, traced: per bench row its wall time and the process's CPU
time, the K of each lone step (a lone target pass of K+1 tokens: a prompt read alone shows as its
length), its passes' wall and thread CPU time, and the passes' prices as the step
loop told them (engine/costs.py) with how many took over 3x their size's median.

On a shared machine the wall time of a row says how busy the cores were as much as what its K cost; its
CPU time (all threads) says what the row's choices cost, whatever the load: two rows' CPU times compare
where their tok/s do not. A row's wall ÷ CPU is its slowdown under load, alike for every row when the
load is alike (with two processes spinning, the tiny pair's rows all ran at 2.2-2.4x).

    OLLAMA_MODELS=demo-models PYTHONPATH=. python scripts/bench_trace.py TRACE.jsonl bench tiny-target \\
        -d tiny-draft --concurrency 1 --in-process -k auto,2,4 --runs 3 --max-tokens 64 --threads 1

writes one JSON line per pass, price and row to TRACE.jsonl and, after the bench's own tables, a line
per row (the warm-up's included) and, per client count and K, the medians over the rounds.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections import Counter, defaultdict

from ollama_spec.bench import concurrent
from ollama_spec.cli import main
from ollama_spec.engine import costs, step_loop


def trace(out) -> None:
    """Wrap the step loop's passes, the prices it tells and the bench's rows (see the module)."""
    run_pass, observe, clients = step_loop.StepLoop._pass, costs.LearnedCosts.observe, concurrent._clients

    def traced_pass(loop, slots, *, priced=True):
        widths = [len(slot.wanted.tokens) for slot in slots]
        draft = int(slots[0].model is not loop._target)
        wall, cpu = time.perf_counter(), time.thread_time()
        run_pass(loop, slots, priced=priced)
        wall, cpu = time.perf_counter() - wall, time.thread_time() - cpu
        out.write(json.dumps({"d": draft, "w": widths, "s": wall, "c": cpu}) + "\n")

    def traced_observe(self, draft, size, seconds):
        out.write(json.dumps({"price": int(draft), "n": size, "s": seconds}) + "\n")
        observe(self, draft, size, seconds)

    def traced_clients(engine, prompts, settings, n, k, max_tokens, run):
        wall, cpu = time.perf_counter(), time.process_time()
        warm = max_tokens != settings.max_tokens  # the warm-up's rows, one per K before the rounds
        out.write(json.dumps({"row": k, "n": n, "run": None if warm else run + 1}) + "\n")
        result = clients(engine, prompts, settings, n, k, max_tokens, run)
        out.write(json.dumps({"end": k, "wall": time.perf_counter() - wall, "cpu": time.process_time() - cpu}) + "\n")
        return result

    step_loop.StepLoop._pass = traced_pass
    costs.LearnedCosts.observe = traced_observe
    concurrent._clients = traced_clients


def rows(path: str) -> list[dict]:
    """Each row of the trace: its K, clients, round, wall and CPU, K per lone step, priced seconds by size."""
    found, row = [], None
    with open(path) as lines:
        records = [json.loads(line) for line in lines]
    for record in records:
        if "row" in record:
            row = {"k": record["row"], "n": record["n"], "run": record["run"], "ks": Counter()}
            row["prices"] = defaultdict(list)
            found.append(row)
        elif "end" in record:
            row["wall"], row["cpu"] = record["wall"], record["cpu"]
        elif "price" in record:
            row["prices"][("draft" if record["price"] else "target", record["n"])].append(record["s"])
        elif not record["d"] and len(record["w"]) == 1:
            row["ks"][record["w"][0] - 1] += 1
    return [row for row in found if "wall" in row]


def outliers(prices: dict) -> tuple[int, int]:
    """Prices over 3x their size's median, and all prices."""
    slow = sum(sum(s > 3 * statistics.median(seen) for s in seen) for seen in prices.values())
    return slow, sum(len(seen) for seen in prices.values())


def report(path: str) -> None:
    by_k = defaultdict(list)
    for row in rows(path):
        slow, priced = outliers(row["prices"])
        ks = " ".join(f"{k}:{n}" for k, n in sorted(row["ks"].items()))
        name = "auto" if row["k"] is None else f"K={row['k']}"
        print(
            f"{'warm-up' if row['run'] is None else 'round ' + str(row['run']):8} {row['n']} client(s) {name:6} wall {row['wall'] * 1e3:7.1f} ms, CPU "
            f"{row['cpu'] * 1e3:7.1f} ms (x{row['wall'] / row['cpu']:.2f}); priced over 3x: {slow} of {priced}; "
            f"K per lone step {ks}"
        )
        if row["run"] is not None:
            by_k[(row["n"], name)].append(row)
    for (n, name), seen in sorted(by_k.items()):
        wall, cpu = (statistics.median(row[key] for row in seen) * 1e3 for key in ("wall", "cpu"))
        print(f"{n} client(s) {name:6} median of {len(seen)} timed rows: wall {wall:.1f} ms, CPU {cpu:.1f} ms")


if __name__ == "__main__":
    path = sys.argv[1]
    with open(path, "w") as out:
        trace(out)
        sys.argv = ["ollama-spec", *sys.argv[2:]]
        try:
            main()
        except SystemExit as exit_:
            if exit_.code:
                raise
    report(path)
