#!/usr/bin/env bash
# The same in-process bench command three times in a row, the first after a busy spell: BUSY processes
# (default 1) spin while that first run loads the pair and calibrates, and stop as its first timed round
# begins. The three runs share a fresh cost cache (what the first measured under load is what the next two
# start from). Prints each run's -k auto median per client count and the spread between runs; issue 49 asks
# that they be within 10 % of each other. Run it on an otherwise quiet machine.
#   BUSY=1 scripts/bench-stable.sh BIN TARGET DRAFT [bench flags...]        (OLLAMA_MODELS as for bench)
# Default flags: --concurrency ${CLIENTS:-4} --in-process -k auto --runs 3 --max-tokens 64.
# It runs `BIN/python -m ollama_spec`: from a checkout's root, that checkout's code (an A/B of two
# worktrees runs the script from each with the same BIN).
set -euo pipefail
if [ $# -lt 3 ]; then echo "usage: scripts/bench-stable.sh BIN TARGET DRAFT [bench flags...]" >&2; exit 2; fi
bin=$1 target=$2 draft=$3
shift 3
work=$(mktemp -d)
spinners=()
stop_spinners() {
    if [ ${#spinners[@]} -gt 0 ]; then kill "${spinners[@]}" 2>/dev/null || true; fi
    spinners=()
}
trap 'stop_spinners; rm -rf "$work"' EXIT
# the 1-minute load average (the machine may be shared: say how busy it was)
load() { cut -d' ' -f1 /proc/loadavg 2>/dev/null || uptime | sed 's/.*average[s]*: *//; s/,.*//'; }
loads=()
export XDG_CACHE_HOME=$work/cache # a fresh cost cache, shared by the three runs

for run in 1 2 3; do
    if [ "$run" = 1 ]; then
        for _ in $(seq "${BUSY:-1}"); do
            "$bin/python" -c "while True: pass" &
            spinners+=($!)
        done
        echo "== run 1: ${#spinners[@]} process(es) busy while it loads, stopped at its first round" >&2
    else
        echo "== run $run" >&2
    fi
    loads[run]=$(load)
    : >"$work/err.$run"
    "$bin/python" -m ollama_spec bench "$target" --draft "$draft" --concurrency "${CLIENTS:-4}" --in-process -k auto \
        --runs 3 --max-tokens 64 "$@" >"$work/out.$run" 2>"$work/err.$run" &
    bench=$!
    while kill -0 "$bench" 2>/dev/null; do
        if [ ${#spinners[@]} -gt 0 ] && grep -q "round 1" "$work/err.$run"; then
            stop_spinners
            echo "   busy spell over at the first round" >&2
        fi
        sleep 0.2
    done
    wait "$bench" || { cat "$work/err.$run" >&2; exit 1; }
    stop_spinners
    cat "$work/out.$run"
    loads[run]="${loads[run]} at its start, $(load) at its end"
done

# each table's auto rows: "CLIENTS auto TOK/S ..."
echo
echo "-k auto, median tok/s of each run (run 1 after the busy spell), code from $("$bin/python" -c 'import os, ollama_spec; print(os.path.dirname(os.path.dirname(ollama_spec.__file__)))'); $(nproc) cores, load average:"
for run in 1 2 3; do echo "  run $run: ${loads[run]}"; done
awk '$1 ~ /^[0-9]+$/ && $2 == "auto" {
        rate[$1, FILENAME] = $3; clients[$1] = 1
        if (!(FILENAME in seen)) { seen[FILENAME] = 1; files[++n] = FILENAME }
     }
     END {
        for (c in clients) {
            line = sprintf("%3s client(s):", c); lo = 0; hi = 0
            for (i = 1; i <= n; i++) {
                r = rate[c, files[i]]; line = line sprintf(" %8.1f", r)
                if (i == 1 || r < lo) lo = r
                if (i == 1 || r > hi) hi = r
            }
            spread = lo > 0 ? (hi / lo - 1) * 100 : 0
            printf "%s   spread %.1f %% (%s)\n", line, spread, spread <= 10 ? "within 10 %" : "OVER 10 %"
        }
     }' "$work/out.1" "$work/out.2" "$work/out.3" | sort -n
