#!/usr/bin/env bash
# Issue #49's acceptance where the time between llama.cpp's calls is what is timed: demo-store's tiny
# pair, whose passes take well under a millisecond (the regime a GPU puts a real pair in), one thread,
# greedy, the same K for every side. Each round, in turn:
#   1. in process, one stream: `bench -k K --native llama-speculative-simple` (ours and llama.cpp's loop
#      timed beside each other, interleaved), with the Python time per target pass outside llama.cpp;
#   2. in process, 1, 2 and 4 clients on 4 slots through the step loop (`bench --concurrency 4
#      --in-process`), with the Python time per step outside llama.cpp's passes;
#   3. served: `serve --parallel 4 -k K` against `llama-server -np 4 --spec-draft-n-max K`, 1 and 4
#      clients, each server alone (scripts/bench-serve.sh, one round);
#   4. served on one slot (`serve --parallel 1 -k K`, the engine of step 1's stream), 1 client: what the
#      HTTP face costs a stream, apart from what four slots cost llama.cpp's passes.
# Then the medians over the rounds with their spread (min-max), and each acceptance ratio:
#   ours ÷ llama-speculative-simple (in process, one stream)      >= 0.9
#   served ours ÷ llama-server, 1 client (a request's decode rate) >= 1.0
#   served ours ÷ llama-server, 4 clients (all clients together)   >= 1.0
#   served single stream ÷ in process single stream (decode rates) >= 0.97
# and, no goal of its own, the served stream on one slot ÷ the same in-process stream.
#
#   scripts/bench-49.sh BIN [STORE]
# BIN holds `python` and `ollama-spec` (a venv's bin). STORE: a demo store with the tiny pair (default
# bench-results/bench-49-store, built with `ollama-spec demo-store` when it lacks the pair).
# Environment, all optional:
#   NATIVE_BIN=build/native/bin   where llama-speculative-simple and llama-server are
#                                 (scripts/build-native-speculative.sh builds them)
#   ROUNDS=5   K=3   TOKENS=96   RUNS=3 (runs of the prompts a round, in process and served alike)
#   ROUND_TIMEOUT=300             seconds each command of a round may take (the run stays bounded)
# About 1 minute a round on a quiet 2-core machine; a busy one takes longer, and its numbers say less.
# The checkout's own ollama_spec is the one run (put first on PYTHONPATH): BIN's venv may hold another copy.
set -euo pipefail
if [ $# -lt 1 ]; then echo "usage: scripts/bench-49.sh BIN [STORE]" >&2; exit 2; fi
bin=$1
store=${2:-bench-results/bench-49-store}
export PYTHONPATH=$(cd "$(dirname "$0")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}
native=${NATIVE_BIN:-build/native/bin}
rounds=${ROUNDS:-5} k=${K:-3} tokens=${TOKENS:-96} runs=${RUNS:-3} limit=${ROUND_TIMEOUT:-300}
for tool in llama-speculative-simple llama-server; do
    if [ ! -x "$native/$tool" ]; then
        echo "$native/$tool is not an executable: set NATIVE_BIN (scripts/build-native-speculative.sh builds it)" >&2
        exit 2
    fi
done
if [ ! -d "$store/manifests/registry.ollama.ai/library/tiny-target" ]; then
    mkdir -p "$store"
    "$bin/ollama-spec" demo-store "$store" >&2
fi
export OLLAMA_MODELS=$store
here=$(cd "$(dirname "$0")" && pwd)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

attempt() {  # FILE COMMAND...: the command, its output in FILE, tried up to 3 times (a busy machine
    # sometimes loses llama-speculative-simple's report); its output's end and a failure after that
    local n
    for n in 1 2 3; do
        if timeout "$limit" "${@:2}" >"$1" 2>&1; then return 0; fi
        echo "   (attempt $n failed: $(grep -m1 -i error "$1" | cut -c1-160))" >&2
    done
    tail -20 "$1" >&2
    exit 1
}

field() {  # FILE SED-EXPRESSION: the first match's captured number, or "?"
    local value
    value=$(sed -n "$2" "$1" | head -1)
    echo "${value:-?}"
}

for round in $(seq 1 "$rounds"); do
    echo "== round $round of $rounds: in process, one stream, K=$k, against llama-speculative-simple" >&2
    attempt "$out/single-$round" "$bin/ollama-spec" bench tiny-target -d tiny-draft -k "$k" --threads 1 --ctx 512 \
        --max-tokens "$tokens" --runs "$runs" --no-ngram --native "$native/llama-speculative-simple"
    grep -E "^(speculative K=|ours: K=|llama.cpp speculative|time outside|ours at K=.* vs llama.cpp)" \
        "$out/single-$round" >&2 || true
    echo "== round $round of $rounds: in process, 1, 2 and 4 clients on 4 slots, K=$k" >&2
    attempt "$out/loop-$round" "$bin/ollama-spec" bench tiny-target -d tiny-draft -k "$k" --threads 1 --ctx 512 \
        --max-tokens "$tokens" --runs 1 --concurrency 4 --in-process
    grep -E "^ +[0-9]+  (K=|python)" "$out/loop-$round" >&2 || true
    echo "== round $round of $rounds: served, 1 and 4 clients, each server alone" >&2
    CLIENTS="1 4" ROUNDS=1 RUNS=$runs MAX_TOKENS=$tokens THREADS=1 K=$k SLOT_CTX=512 LLAMA_SERVER=$native/llama-server \
        attempt "$out/served-$round" "$here/bench-serve.sh" "$bin" tiny-target tiny-draft
    grep -E "^[0-9] client\(s\):" "$out/served-$round" >&2 || true
    echo "== round $round of $rounds: served on one slot, 1 client" >&2
    CLIENTS=1 PARALLEL=1 ROUNDS=1 RUNS=$runs MAX_TOKENS=$tokens THREADS=1 K=$k SLOT_CTX=512 LLAMA_SERVER="" \
        attempt "$out/one-slot-$round" "$here/bench-serve.sh" "$bin" tiny-target tiny-draft
    grep -E "tok/s a request" "$out/one-slot-$round" >&2 || true
done

# One line a quantity: its value in each round (a ratio worked out per round, so the drift between
# rounds falls on both sides of it).
{
    for round in $(seq 1 "$rounds"); do
        s=$out/single-$round l=$out/loop-$round v=$out/served-$round o=$out/one-slot-$round
        ours=$(field "$s" 's/^ours at K=[0-9]* vs llama.cpp speculative-simple.*: \([0-9.]*\) vs \([0-9.]*\) tok\/s.*/\1/p')
        spec=$(field "$s" 's/^ours at K=[0-9]* vs llama.cpp speculative-simple.*: \([0-9.]*\) vs \([0-9.]*\) tok\/s.*/\2/p')
        echo "in_process_tok_s $ours"
        echo "speculative_simple_tok_s $spec"
        echo "python_ms_a_pass_one_stream $(field "$s" 's/^time outside llama.cpp per target pass.*: \([0-9.]*\) ms.*/\1/p')"
        for n in 1 2 4; do
            echo "python_ms_a_step_loop_${n}_clients $(field "$l" "s/^ *$n  python *\([0-9.]*\) .*/\1/p")"
        done
        for n in 1 4; do
            echo "served_ours_${n}_clients $(field "$v" "s/^$n client(s): *\([0-9.]*\) \/ \([0-9.]*\).*/\1/p")"
            echo "served_llama_server_${n}_clients $(field "$v" "s/^$n client(s): *\([0-9.]*\) \/ \([0-9.]*\).*/\2/p")"
        done
        echo "served_one_slot_1_client $(field "$o" 's/.*median \([0-9.]*\) tok\/s a request.*/\1/p')"
    done
} >"$out/values"

"$bin/python" - "$out/values" "$rounds" "$k" <<'EOF'
import statistics, sys
values: dict[str, list[float]] = {}
for line in open(sys.argv[1]):
    name, value = line.split()
    values.setdefault(name, [])
    if value != "?":
        values[name].append(float(value))
rounds, k = int(sys.argv[2]), sys.argv[3]

def ratio(a, b):
    return [x / y for x, y in zip(values[a], values[b]) if y]

def line(label, xs, goal=None):
    if not xs:
        return f"{label:<58} -"
    text = f"{label:<58} {statistics.median(xs):9.2f}  ({min(xs):.2f}-{max(xs):.2f}, {len(xs)} rounds)"
    if goal is not None:
        text += f"  goal >= {goal}: {'met' if statistics.median(xs) >= goal else 'UNMET'}"
    return text

print(f"\n#49 on the tiny pair, K={k}, one thread, greedy: medians of {rounds} interleaved rounds (min-max)")
for name, xs in values.items():
    print(line(name, xs))
print()
print(line("ours / llama-speculative-simple, in process, one stream", ratio("in_process_tok_s", "speculative_simple_tok_s"), 0.9))
for n in (1, 4):
    print(line(f"served: ours / llama-server, {n} client(s)", ratio(f"served_ours_{n}_clients", f"served_llama_server_{n}_clients"), 1.0))
print(line("served single stream / in process single stream", ratio("served_ours_1_clients", "in_process_tok_s"), 0.97))
print(line("served single stream on one slot / in process single stream", ratio("served_one_slot_1_client", "in_process_tok_s")))
# the same ratio for llama.cpp's own server and loop: where it is far below 1 too, the HTTP client's
# rate bounds both servers (the tiny pair's answers come faster than a client takes them in)
print(line("  for reference: llama-server / llama-speculative-simple", ratio("served_llama_server_1_clients", "speculative_simple_tok_s")))
EOF
