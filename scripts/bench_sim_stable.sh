#!/usr/bin/env bash
# scripts/bench-stable.sh on the simulated clock (scripts/bench_sim_clock.py): the same in-process bench
# three times with one cost cache, the first run in a busy spell from its start (BUSY, BUSY_ADD_MS, BUSY_S
# or BUSY_PASSES as bench_sim_clock.py reads them; default every pass 1.5x and +1 ms for the first 6
# simulated seconds: the load, the calibration and a little of the first round; a spell under the 2x at
# which the loop's passes set a calibration aside, engine/costs.py), the next two quiet (the
# cost model's own NOISE and SPIKE apply to all three). Prints, per run and client count, -k auto's median
# tok/s, the best fixed K's, and their ratio, then the spread of auto's medians over the runs. No process
# spins: the spell is made up, so the machine's real load does not enter (the models still run).
#   OLLAMA_MODELS=demo-models CLIENTS="1 4" scripts/bench_sim_stable.sh BIN TARGET DRAFT [bench flags...]
# Default flags: --concurrency 4 --in-process -k auto,2,4 --runs 2 --max-tokens 32. Runs `BIN/python
# scripts/bench_sim_clock.py` with PYTHONPATH=. from the current directory (a checkout's code; for an A/B,
# copy this script and bench_sim_clock.py into the other checkout and run them there).
set -euo pipefail
if [ $# -lt 3 ]; then echo "usage: scripts/bench_sim_stable.sh BIN TARGET DRAFT [bench flags...]" >&2; exit 2; fi
bin=$1 target=$2 draft=$3
shift 3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export XDG_CACHE_HOME=$work/cache PYTHONPATH=. CLIENTS=${CLIENTS:-4}
for run in 1 2 3; do
    if [ "$run" = 1 ]; then
        spell=(BUSY="${BUSY:-1.5}" BUSY_ADD_MS="${BUSY_ADD_MS:-1}" BUSY_S="${BUSY_S:-6}" BUSY_PASSES="${BUSY_PASSES:-inf}")
    else
        spell=(BUSY=1 BUSY_ADD_MS=0)
    fi
    env "${spell[@]}" "$bin/python" scripts/bench_sim_clock.py bench "$target" --draft "$draft" --concurrency 4 \
        --in-process -k auto,2,4 --runs 2 --max-tokens 32 --out "$work/out.$run" "$@" >"$work/log.$run" 2>&1 ||
        { cat "$work/log.$run" >&2; exit 1; }
    # what the run leaves in the cost cache for the next (a calibration, as draft step / target alone)
    "$bin/python" - "$XDG_CACHE_HOME/ollama-spec/step-costs.json" "$run" <<'PY'
import json, sys

try:
    entries = json.load(open(sys.argv[1]))
except OSError:
    entries = {}
kept = [e for e in entries.values() if "verify_s" in e]
said = ", ".join(f"draft step {e['draft_step_s'] * 1e3:.2f} ms, target alone {e['verify_s'][0] * 1e3:.2f} ms" for e in kept)
print(f"after run {sys.argv[2]} the cache holds: {said or 'no calibration'}")
PY
done
"$bin/python" - "$work" <<'PY'
import json, sys

runs = [json.load(open(f"{sys.argv[1]}/out.{run}/results-concurrent.json"))["cells"] for run in (1, 2, 3)]
for n in sorted({c["clients"] for c in runs[0]}):
    autos = []
    for run, cells in enumerate(runs, 1):
        rows = {c["k"]: c for c in cells if c["clients"] == n}
        auto = rows.pop("auto")
        best = max(rows, key=lambda k: rows[k]["median"])
        autos.append(auto["median"])
        spell = " (busy spell at load)" if run == 1 else ""
        print(
            f"{n} client(s), run {run}{spell}: auto {auto['median']:.1f} tok/s, best K={best} "
            f"{rows[best]['median']:.1f}: auto / best {auto['median'] / rows[best]['median']:.3f}"
        )
    print(f"{n} client(s): auto's medians spread {(max(autos) / min(autos) - 1) * 100:.1f} % over the three runs")
PY
