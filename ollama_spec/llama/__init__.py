"""The one seam to llama.cpp: loading, evaluating, grammars, RPC, embeddings.

llama.cpp's CPU passes run on OpenMP (libgomp), which reads its settings once, when llama.cpp's libraries
load: so they are set here, before any module of the seam imports llama_cpp. Left to itself, a thread that
reaches one of a pass's barriers first spins about 3 ms (300,000 rounds) before it sleeps. Quiet, a barrier's
threads arrive within microseconds and nothing changes; where other processes share the cores, the sibling
it waits for is often off its core, and the spin burns the slice that sibling needed: the demo pair's
48-token prompt pass at load 7 on 2 cores took 2-4x as long with it (scripts/bench_latency.py). A tenth of it
(~0.3 ms) still covers a quiet barrier and the loop's Python between two passes of a step. A user's own
GOMP_SPINCOUNT or OMP_WAIT_POLICY is kept.
"""

import os

SPIN_COUNT = "30000"  # libgomp's rounds before a waiting thread sleeps (its own estimate: ~100,000 a millisecond)

if "GOMP_SPINCOUNT" not in os.environ and "OMP_WAIT_POLICY" not in os.environ:
    os.environ["GOMP_SPINCOUNT"] = SPIN_COUNT
