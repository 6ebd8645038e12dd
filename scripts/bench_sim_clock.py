"""`ollama-spec bench ...` on a simulated clock: every llama_decode advances it by a fixed cost model, so
that the K choices of `-k auto` can be compared with the fixed-K rows on a shared, busy machine.

The models still run (the tokens, the acceptance and every choice are the real ones); only the time
is made up: a target pass of n tokens (padding counted) takes T0 + T1·n ms, a draft pass D0 + D1·n, each
optionally times exp(N(0, NOISE)) and, with chance SPIKE, 3× (a descheduled pass). Everything that
reads time.perf_counter (the loop's pass prices, the calibration, the bench's tok/s) reads this clock;
Python between passes costs nothing. Which model a pass is for is told by its file's size (over
BIG_BYTES: the target). CLIENTS (e.g. "4 8") picks the client counts. With TRACE=FILE, one JSON line per
pass of the step loop ({"d": draft, "w": each sequence's tokens, "p": priced, "plan": the batch's
planned K}) and one per bench row ({"row": K or null, "n": clients}).

A busy spell (other processes sharing the cores) from the start: BUSY=F makes every pass F times as
long and BUSY_ADD_MS adds that much to each (a descheduled slice weighs most on the smallest passes),
until BUSY_S simulated seconds have gone by or BUSY_PASSES passes ran (whichever is set; both: the
first). What a spell adds to a pass is what the process waited for a CPU (engine/cpu_wait.py reads it
here, the step loop's thread's waits too). DESCHED=F shares the core with a spinning process at any time,
as a scheduler does: after every DESCHED_MS (default 3) ms the passes ran, the pass under way waits F/(1-F)
times that for the core (F=0.5: half the time; also counted as waited). On a pair whose passes take well
under a slice, one pass in many then takes many times its cost. XDG_CACHE_HOME kept between
runs carries the cost cache from one run to the next, as a restart does: `scripts/bench_sim_stable.sh`
runs one command three times so, the first in a busy spell.

Row order matters: the first row of the first round reads every prompt cold (the others find them
in the slots' caches), and `-k auto` is always the first row; compare the rounds after the first.

    OLLAMA_MODELS=demo-models CLIENTS=8 PYTHONPATH=. python scripts/bench_sim_clock.py \\
        bench synth-target -d synth-draft --concurrency 8 --in-process --max-tokens 64 --ctx 2048 -k auto,4 --runs 2
"""

from __future__ import annotations

import json
import math
import os
import random
import sys
import time

import ollama_spec.llama.model as llama_model
from ollama_spec.bench import concurrent
from ollama_spec.cli import bench_local, main
from ollama_spec.engine import step_loop
from ollama_spec.llama import kv_cache

BIG_BYTES = 6e8


def _env(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


def simulate() -> None:
    """Replace the clock by the cost model (see the module)."""
    now = [1000.0]
    target = (_env("T0", 35.0) / 1e3, _env("T1", 4.0) / 1e3)
    draft = (_env("D0", 3.0) / 1e3, _env("D1", 0.4) / 1e3)
    noise, spike, rng = _env("NOISE", 0.0), _env("SPIKE", 0.0), random.Random(int(_env("SEED", 0)))
    big: dict[str, bool] = {}
    run = kv_cache.SequenceCache._run
    busy, busy_add = _env("BUSY", 1.0), _env("BUSY_ADD_MS", 0.0) / 1e3
    busy_until, busy_passes = now[0] + _env("BUSY_S", math.inf), _env("BUSY_PASSES", math.inf)
    passes, waited = [0], [0.0]
    desched, slice_s = _env("DESCHED", 0.0), _env("DESCHED_MS", 3.0) / 1e3
    ran = [0.0, slice_s]  # the passes' seconds so far, and where the next slice ends

    def timed_run(cache, batch) -> None:
        run(cache, batch)
        name = cache._name
        if name not in big:
            big[name] = os.path.getsize(os.path.join(os.environ["OLLAMA_MODELS"], "blobs", name)) > BIG_BYTES
        fixed, per_token = target if big[name] else draft
        seconds = fixed + per_token * batch.n_tokens
        if noise:
            seconds *= math.exp(rng.gauss(0.0, noise))
        if spike and rng.random() < spike:
            seconds *= 3.0
        passes[0] += 1
        if (busy != 1.0 or busy_add) and now[0] < busy_until and passes[0] <= busy_passes:
            extra = seconds * (busy - 1.0) + busy_add
            waited[0] += extra
            seconds += extra
        ran[0] += seconds
        while desched and ran[0] >= ran[1]:
            ran[1] += slice_s
            waited[0] += slice_s * desched / (1.0 - desched)
            seconds += slice_s * desched / (1.0 - desched)
        now[0] += seconds

    kv_cache.SequenceCache._run = timed_run
    time.perf_counter = lambda: now[0]
    llama_model.perf_counter = time.perf_counter
    try:
        from ollama_spec.engine import cpu_wait
    except ImportError:  # a checkout from before cpu_wait (an A/B's old side)
        return
    cpu_wait.waited_s = lambda: waited[0]


def trace(path: str) -> None:
    """One JSON line per pass of the step loop and per bench row (see the module)."""
    out = open(path, "w")  # noqa: SIM115 - open until the process ends
    run_pass, clients = step_loop.StepLoop._pass, concurrent._clients

    def traced_pass(loop, slots, *, priced=True):
        model, widths = slots[0].model, [len(slot.wanted.tokens) for slot in slots]
        run_pass(loop, slots, priced=priced)
        record = {"d": int(model is not loop._target), "w": widths, "p": priced, "plan": loop._k._plan[0]}
        out.write(json.dumps(record) + "\n")

    def traced_clients(engine, prompts, settings, n, k, max_tokens, run):
        out.write(json.dumps({"row": k, "n": n, "max": max_tokens}) + "\n")
        return clients(engine, prompts, settings, n, k, max_tokens, run)

    step_loop.StepLoop._pass = traced_pass
    concurrent._clients = traced_clients


if __name__ == "__main__":
    if "CLIENTS" in os.environ:
        counts = [int(n) for n in os.environ["CLIENTS"].split()]
        bench_local.client_counts = lambda most: counts
    simulate()
    if os.environ.get("TRACE"):
        trace(os.environ["TRACE"])
    sys.argv = ["ollama-spec", *sys.argv[1:]]
    main()
