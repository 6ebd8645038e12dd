#!/usr/bin/env bash
# -k auto beside the fixed Ks while other processes keep cores busy (a policy that learns its costs from the
# clock must not lock onto a noisy stretch). The in-process bench, its rows interleaved, with BUSY spinning
# processes (default 2) started before and stopped after, however the bench ends; then, per client count,
# auto's share of the best fixed K measured beside it (issue 49 asks >= 0.9 with two busy).
#   BUSY=2 CLIENTS=1 scripts/bench-busy-core.sh BIN TARGET DRAFT [bench flags...]   (OLLAMA_MODELS as for bench)
# Default flags: --concurrency $CLIENTS (default 1) --in-process -k auto,2,4,6 --runs 3 --max-tokens 128.
# The bench runs as `BIN/python -m ollama_spec` from the current directory (a source tree's code, where
# run from one), and the load average is printed before and after.
set -euo pipefail
if [ $# -lt 3 ]; then echo "usage: scripts/bench-busy-core.sh BIN TARGET DRAFT [bench flags...]" >&2; exit 2; fi
bin=$1 target=$2 draft=$3
shift 3
spinners=()
table=$(mktemp)
trap 'kill "${spinners[@]}" 2>/dev/null || true; rm -f "$table"' EXIT
for _ in $(seq "${BUSY:-2}"); do
    "$bin/python" -c "while True: pass" &
    spinners+=($!)
done
echo "== ${#spinners[@]} process(es) kept busy (${spinners[*]}) while the rows run; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$bin/python" -m ollama_spec bench "$target" --draft "$draft" --concurrency "${CLIENTS:-1}" --in-process -k auto,2,4,6 \
    --runs 3 --max-tokens 128 "$@" | tee "$table"
# the table's rows: "CLIENTS ROW TOK/S ..." with ROW auto or K=n
awk '$1 ~ /^[0-9]+$/ && ($2 == "auto" || $2 ~ /^K=/) {
        if ($2 == "auto") auto[$1] = $3
        else if (!($1 in best) || $3 > best[$1]) { best[$1] = $3; k[$1] = $2 }
     }
     END {
        for (n in auto) if (n in best && best[n] > 0)
            printf "%s client(s): auto %.1f tok/s = %.2f x the best fixed K (%s, %.1f tok/s), %d busy\n",
                n, auto[n], auto[n] / best[n], k[n], best[n], busy
     }' busy="${#spinners[@]}" "$table" | sort -n
echo "== load average at the end $(cut -d' ' -f1-3 /proc/loadavg)" >&2
