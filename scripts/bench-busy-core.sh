#!/usr/bin/env bash
# -k auto beside the fixed Ks while other processes keep cores busy (a policy that learns its costs from the
# clock must not lock onto a noisy stretch). The in-process bench, its rows interleaved (each round's rows in
# a turned order, so no row always follows the same one), with BUSY spinning processes (default 2) started
# before and stopped after, however the bench ends; then, per client count, auto's share of the best fixed K
# measured beside it (issue 49 asks >= 0.9 with two busy), two ways:
#   - the ratio of the medians over the rounds (auto's median ÷ the best fixed K's median);
#   - paired by round: in each round auto ÷ that same fixed K in that round, their median and spread. Rows
#     a second apart see the same load; the rounds, minutes apart on a shared machine, do not.
# Each spinner is pinned to a core of its own, in turn (taskset, where there is one; PIN=0 leaves them free),
# so that every core is shared throughout: left free on the 2-core VM, the two spinners often shared one
# core, and some rows of the tiny pair ran at their quiet speed (wall = CPU time) beside rows at a fifth.
#   BUSY=2 CLIENTS=1 ROUNDS=5 scripts/bench-busy-core.sh BIN TARGET DRAFT [bench flags...]   (OLLAMA_MODELS as for bench)
# Default flags: --concurrency $CLIENTS (default 1) --in-process -k auto,2,4,6 --runs $ROUNDS (default 5)
# --max-tokens 128. The bench runs as `BIN/python -m ollama_spec` from the current directory (a source tree's
# code, where run from one), and the load average is printed before and after.
set -euo pipefail
if [ $# -lt 3 ]; then echo "usage: scripts/bench-busy-core.sh BIN TARGET DRAFT [bench flags...]" >&2; exit 2; fi
bin=$1 target=$2 draft=$3
shift 3
spinners=()
out=$(mktemp -d)
trap 'kill "${spinners[@]}" 2>/dev/null || true; rm -rf "$out"' EXIT
cores=$(nproc)
pin=()
for i in $(seq 0 $(("${BUSY:-2}" - 1))); do
    if [ "${PIN:-1}" != 0 ] && command -v taskset >/dev/null; then pin=(taskset -c $((i % cores))); fi
    "${pin[@]}" "$bin/python" -c "while True: pass" &
    spinners+=($!)
done
echo "== ${#spinners[@]} process(es) kept busy (${spinners[*]}${pin:+, pinned a core each}) while the rows run; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$bin/python" -m ollama_spec bench "$target" --draft "$draft" --concurrency "${CLIENTS:-1}" --in-process -k auto,2,4,6 \
    --runs "${ROUNDS:-5}" --max-tokens 128 --out "$out" "$@"
"$bin/python" - "$out/results-concurrent.json" "${#spinners[@]}" <<'PY'
import json, statistics, sys

cells, busy = json.load(open(sys.argv[1]))["cells"], int(sys.argv[2])
for n in sorted({c["clients"] for c in cells}):
    rows = {c["k"]: c for c in cells if c["clients"] == n}
    auto = rows.pop("auto", None)
    if auto is None or not rows:
        continue
    best = max(rows, key=lambda k: rows[k]["median"])
    paired = sorted(a / b for a, b in zip(auto["tok_s"], rows[best]["tok_s"]) if b > 0)
    print(
        f"{n} client(s): auto {auto['median']:.1f} tok/s = {auto['median'] / rows[best]['median']:.2f} x the best "
        f"fixed K (K={best}, {rows[best]['median']:.1f} tok/s); paired by round {statistics.median(paired):.2f} "
        f"({', '.join(f'{r:.2f}' for r in paired)}), {busy} busy"
    )
PY
echo "== load average at the end $(cut -d' ' -f1-3 /proc/loadavg)" >&2
