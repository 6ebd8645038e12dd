"""`ollama-spec bench ...` on a clock where llama.cpp's passes cost a fixed table and the Python between
them costs the process's CPU time: for comparing `-k auto` with fixed Ks on the tiny pair, where the
Python between passes is what a step costs, on a shared and busy machine.

scripts/bench_sim_clock.py makes every pass cost a line and Python nothing; here only llama.cpp's
passes are made up. RECORD=FILE runs the command on the real clock and writes, per model and size
(tokens in the pass), the median thread CPU time of its passes; TABLE=FILE then runs on the made-up
clock: a pass costs its size's time in the table (sizes between two in it on the line through them),
and everything else what the process spent on the CPU meanwhile, every thread counted (the clients'
readers too: they take the core from the loop on a busy machine). Other work on the machine then
moves the numbers far less than it moves the wall clock: on a 2-core machine at load 6-10, one row's
three rounds spread 5-20 % against 2-3x. What a pass waits for a core is not counted, nor is the
time of a cold cache that a busy machine's passes find.

The target is told from the draft by its file's size (over BIG_BYTES). CLIENTS picks the client
counts, as in scripts/bench_sim_clock.py.

    OLLAMA_MODELS=demo-models BIG_BYTES=8e5 RECORD=tiny.json PYTHONPATH=. python scripts/bench_py_clock.py \\
        bench tiny-target -d tiny-draft --concurrency 8 --in-process --max-tokens 64 --ctx 512 --threads 1
    OLLAMA_MODELS=demo-models BIG_BYTES=8e5 TABLE=tiny.json CLIENTS="2 4 8" PYTHONPATH=. python \\
        scripts/bench_py_clock.py bench tiny-target -d tiny-draft --concurrency 8 --in-process \\
        --max-tokens 64 --ctx 512 --threads 1 -k auto,1,2,3
"""

from __future__ import annotations

import atexit
import bisect
import json
import os
import statistics
import sys
import time
from collections import defaultdict

import ollama_spec.llama.model as llama_model
from ollama_spec.cli import bench_local, main
from ollama_spec.llama import kv_cache

BIG_BYTES = float(os.environ.get("BIG_BYTES", "6e8"))


def _model(cache, sizes: dict[str, str]) -> str:
    """Which model a cache's passes are for ("target" or "draft"), by its file's size."""
    name = cache._name
    if name not in sizes:
        path = os.path.join(os.environ["OLLAMA_MODELS"], "blobs", name)
        sizes[name] = "target" if os.path.getsize(path) > BIG_BYTES else "draft"
    return sizes[name]


def record(path: str) -> None:
    """Time every pass (thread CPU), and write each model's median by size to `path` at exit."""
    run, sizes, timed = kv_cache.SequenceCache._run, {}, defaultdict(list)

    def timed_run(cache, batch) -> None:
        started = time.thread_time()
        run(cache, batch)
        timed[_model(cache, sizes), batch.n_tokens].append(time.thread_time() - started)

    def write() -> None:
        table: dict[str, dict[int, float]] = {"target": {}, "draft": {}}
        for (model, size), seconds in timed.items():
            table[model][size] = statistics.median(seconds)
        with open(path, "w") as out:
            json.dump(table, out, indent=1)

    kv_cache.SequenceCache._run = timed_run
    atexit.register(write)


def simulate(path: str) -> None:
    """Every pass costs its size's time in the table at `path`; the rest, the process's CPU time."""
    with open(path) as file:
        table = {
            model: sorted((int(size), s) for size, s in by_size.items()) for model, by_size in json.load(file).items()
        }
    run, sizes, passes_s, inside_s = kv_cache.SequenceCache._run, {}, [1000.0], [0.0]

    def cost(model: str, size: int) -> float:
        points = table[model]
        if len(points) == 1:
            return points[0][1]
        at = min(max(bisect.bisect_left(points, (size, 0.0)), 1), len(points) - 1)
        (x0, y0), (x1, y1) = points[at - 1], points[at]
        return max(y0 + (y1 - y0) * (size - x0) / (x1 - x0), 0.0)

    def timed_run(cache, batch) -> None:
        started = time.thread_time()
        run(cache, batch)
        inside_s[0] += time.thread_time() - started
        passes_s[0] += cost(_model(cache, sizes), batch.n_tokens)

    kv_cache.SequenceCache._run = timed_run
    time.perf_counter = lambda: passes_s[0] + time.process_time() - inside_s[0]
    llama_model.perf_counter = time.perf_counter


if __name__ == "__main__":
    if "CLIENTS" in os.environ:
        counts = [int(n) for n in os.environ["CLIENTS"].split()]
        bench_local.client_counts = lambda most: counts
    if os.environ.get("RECORD"):
        record(os.environ["RECORD"])
    else:
        simulate(os.environ["TABLE"])
    sys.argv = ["ollama-spec", *sys.argv[1:]]
    main()
