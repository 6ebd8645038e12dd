#!/usr/bin/env bash
# The pair served with slots, timed by 1 and 4 clients at once (make bench runs it after the in-process
# rows); with LLAMA_SERVER, llama.cpp's own server with the same draft next, measured the same way.
#   scripts/bench-serve.sh BIN TARGET DRAFT [serve flags...]     (OLLAMA_MODELS as for serve)
# BIN holds `python` and `ollama-spec` (a venv's bin). Environment, all optional:
#   CLIENTS="1 4"   the client counts, each a run of the bench prompts by that many clients at once
#   ROUNDS=1        rounds of ours then llama-server: this machine's speed drifts, a ratio per round holds
#   LLAMA_SERVER    a llama-server binary: serves the same two GGUF blobs, --spec-type draft-simple
#                   (draft-eagle3 when DRAFT is an EAGLE-3 head; with DRAFT mtp, the target's blob alone
#                   and draft-mtp) --spec-draft-n-max K -np PARALLEL, after ours has stopped
#   K               the draft length for both servers (ours: -k K); unset: ours chooses, llama-server 6
#                   (its best draft length on the demo pair)
#   NATIVE_KS       llama-server's draft lengths to try, e.g. "4 6 8": each round serves it at each, and
#                   its best at each client count is the one ours is compared with (default: K, else 6)
#   PARALLEL=4      slots: ours --parallel, llama-server -np
#   SLOT_CTX=2048   each slot's context, for both servers (llama-server's -c is all slots' together)
#   MAX_TOKENS=96   each request's max_tokens (fewer: a quick check that every step runs)
#   RUNS=1          runs of the prompt set at each client count, timed as one (1 client: a request's rate,
#                   the median over the runs; more: all the runs' tokens over their wall time). A run
#                   of one client on a fast pair is a few tens of milliseconds: more runs time it steadily
#   WARM=1          each server, once started, answers the prompt set by PARALLEL clients untimed first, so
#                   that every client count is timed as the in-process rows are (their prompts in the slots'
#                   caches or saved in host RAM, -k auto's prices learned from the passes); WARM=0 times a
#                   fresh server, whose first client count also reads each prompt
#   THREADS         --threads / -t for both; NGL: llama-server's -ngl and -ngld (default 99 = all)
#   CEILING         a results-concurrent.json of `bench --concurrency N --in-process`: each rate is also
#                   given as a share of the ideal schedule's ceiling at that client count (at most
#                   PARALLEL: more clients queue for the slots); CEILING=measure runs that bench first,
#                   on PARALLEL slots with these requests (MAX_TOKENS, SLOT_CTX, THREADS; -k auto and
#                   CEILING_K, default 8, whose acceptance by position the ideal schedule drafts with),
#                   and shows how far above llama-server the ceiling lets any schedule of ours go;
#                   CEILING_ROUNDS=3 rounds of it, interleaved (a yardstick of one round drifts with the machine)
# The checkout's own ollama_spec is the one run (put first on PYTHONPATH): BIN's venv may hold another copy.
set -euo pipefail
if [ $# -lt 3 ]; then echo "usage: scripts/bench-serve.sh BIN TARGET DRAFT [serve flags...]" >&2; exit 2; fi
bin=$1 target=$2 draft=$3
shift 3
export PYTHONPATH=$(cd "$(dirname "$0")/.." && pwd)${PYTHONPATH:+:$PYTHONPATH}
if [ -n "${LLAMA_SERVER:-}" ] && [ ! -x "$LLAMA_SERVER" ]; then
    echo "LLAMA_SERVER=$LLAMA_SERVER is not an executable (scripts/build-native-speculative.sh builds one)" >&2
    exit 2
fi
clients=${CLIENTS:-1 4}
parallel=${PARALLEL:-4}
native_ks=${NATIVE_KS:-${K:-6}}
slot_ctx=${SLOT_CTX:-2048}
max_tokens=${MAX_TOKENS:-96}
runs=${RUNS:-1}
port=$("$bin/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
log=$(mktemp)
measured=$(mktemp -d)
server=
stop() { if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi; server=; }
trap 'stop; rm -rf "$log" "$measured"' EXIT

wait_up() {  # the health URL answers, or the server's log and a failure
    for _ in $(seq 1 600); do
        if "$bin/python" -c "import httpx; httpx.get('$1', timeout=1).raise_for_status()" 2>/dev/null; then return 0; fi
        if ! kill -0 "$server" 2>/dev/null; then cat "$log" >&2; return 1; fi
        sleep 0.5
    done
    echo "no answer from $1 in 5 minutes" >&2
    return 1
}

declare -A rate  # "server round clients" -> tok/s: a request's with one client, all together with more
declare -A best_k  # "round clients" -> llama-server's best --spec-draft-n-max

warm() {  # the prompt set once by $parallel clients, untimed (WARM)
    [ "${WARM:-1}" = 0 ] && return 0
    echo "== $1: warm-up, the prompts by $parallel client(s) at once, untimed"
    "$bin/ollama-spec" bench "$target" --url "http://127.0.0.1:$port/v1" --runs 1 --max-tokens "$max_tokens" \
        --concurrency "$parallel" --no-warmup >/dev/null
}

measure() {  # KEY NAME ROUND: every client count against the server on $port
    local n out
    warm "$2"
    for n in $clients; do
        echo "== $2, $n client(s) at once${rounds_note}"
        out=$("$bin/ollama-spec" bench "$target" --url "http://127.0.0.1:$port/v1" --runs "$runs" \
            --max-tokens "$max_tokens" --concurrency "$n" | tail -2)
        echo "$out"
        if [ "$n" = 1 ]; then
            rate["$1 $3 $n"]=$(sed -n 's/.*median \([0-9.]*\) tok\/s a request.*/\1/p' <<<"$out" | tail -1)
        else
            rate["$1 $3 $n"]=$(sed -n 's/.* at once: \([0-9.]*\) tok\/s in all.*/\1/p' <<<"$out" | tail -1)
        fi
    done
}

blob() { "$bin/python" -c "from ollama_spec import resolve_model; print(resolve_model('$1').path)"; }
spec_type() {  # llama-server never detects a head: it is asked for by --spec-type
    "$bin/python" -c "from ollama_spec import resolve_model; from ollama_spec.models.heads import is_head
print('draft-eagle3' if is_head(resolve_model('$1').info) else 'draft-simple')"
}
if [ "$draft" = mtp ]; then  # the target's own MTP layers: llama.cpp drafts with them from its GGUF alone
    native_draft=(--spec-type draft-mtp)
elif [ -n "${LLAMA_SERVER:-}" ]; then
    native_draft=(-md "$(blob "$draft")" --spec-type "$(spec_type "$draft")" -ngld "${NGL:-99}")
fi
ours_k=()
[ -n "${K:-}" ] && ours_k=(-k "$K")
threads=()
[ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")
rounds=${ROUNDS:-1}

if [ "${CEILING:-}" = measure ]; then  # the ideal schedule of these requests on our engine, in process
    [ "$draft" = mtp ] && ceiling_draft=mtp || ceiling_draft=$draft
    echo "== the ceiling: bench --concurrency $parallel --in-process, $max_tokens tokens a request, ${CEILING_ROUNDS:-3} rounds"
    "$bin/ollama-spec" bench "$target" -d "$ceiling_draft" --concurrency "$parallel" --in-process \
        -k "auto,${CEILING_K:-8}" --runs "${CEILING_ROUNDS:-3}" --max-tokens "$max_tokens" --ctx "$slot_ctx" "${threads[@]}" \
        --out "$measured" 2>"$log" || { cat "$log" >&2; exit 1; }
    CEILING=$measured/results-concurrent.json
fi
for round in $(seq 1 "$rounds"); do
    rounds_note=""
    [ "$rounds" -gt 1 ] && rounds_note=" (round $round of $rounds)"
    "$bin/ollama-spec" serve "$target" --draft "$draft" --port "$port" --parallel "$parallel" --ctx "$slot_ctx" \
        "${threads[@]}" "${ours_k[@]}" "$@" >"$log" 2>&1 &
    server=$!
    wait_up "http://127.0.0.1:$port/health"
    measure ours "ollama-spec serve --parallel $parallel" "$round"
    stop

    for native_k in $native_ks; do
        [ -n "${LLAMA_SERVER:-}" ] || break
        ngl=${NGL:-99}
        "$LLAMA_SERVER" -m "$(blob "$target")" "${native_draft[@]}" --spec-draft-n-max "$native_k" \
            -np "$parallel" -c $((parallel * slot_ctx)) -ngl "$ngl" --temp 0 ${THREADS:+-t "$THREADS"} \
            --host 127.0.0.1 --port "$port" >"$log" 2>&1 &
        server=$!
        wait_up "http://127.0.0.1:$port/health"
        measure "native-$native_k" "llama-server -np $parallel --spec-draft-n-max $native_k, the same draft" "$round"
        stop
        for n in $clients; do  # its best draft length at each client count, this round
            r=${rate["native-$native_k $round $n"]:-}
            best=${rate["native $round $n"]:-}
            if [ -n "$r" ] && { [ -z "$best" ] || awk -v a="$r" -v b="$best" 'BEGIN { exit !(a > b) }'; }; then
                rate["native $round $n"]=$r
                best_k["$round $n"]=$native_k
            fi
        done
    done
done

median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { if (NR) printf "%.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
rates() {  # WHO N: that server's rate at N clients, one a round (the rounds that have one)
    local round r
    for round in $(seq 1 "$rounds"); do
        r=${rate["$1 $round $2"]:-}
        [ -n "$r" ] && echo "$r"
    done
}
ceiling() {  # the ideal schedule's tok/s and in-process auto's at $1 clients on $parallel slots, from $CEILING
    [ -n "${CEILING:-}" ] && [ -f "$CEILING" ] || return 0
    "$bin/python" - "$CEILING" "$(($1 < parallel ? $1 : parallel))" <<'PY'
import json, sys
data, n = json.load(open(sys.argv[1])), sys.argv[2]
top = data["ceiling"].get(n)
auto = [c["median"] for c in data["cells"] if str(c["clients"]) == n and c["k"] == "auto"]
if top:
    print(f"{top:.1f} {auto[0]:.1f}" if auto else f"{top:.1f}")
PY
}
if [ -n "${CEILING:-}" ] && [ -f "$CEILING" ]; then
    echo "== the ideal schedule's ceiling on $parallel slots ($CEILING): each rate's share of it, by round"
    for n in $clients; do
        read -r top auto <<<"$(ceiling "$n")"
        [ -n "$top" ] || continue
        line="$n client(s), ceiling $top tok/s"
        [ -n "$auto" ] && line="$line (in process, -k auto: $auto, $(ratio "$auto" "$top"))"
        line="$line:"
        for who in ours native; do
            mapfile -t got < <(rates "$who" "$n")
            [ "${#got[@]}" -gt 0 ] || continue
            line="$line  ${who/native/llama-server}"
            for r in "${got[@]}"; do line="$line $(ratio "$r" "$top")"; done
        done
        echo "$line"
        mapfile -t got < <(rates ours "$n")
        if [ -n "$auto" ] && [ "${#got[@]}" -gt 0 ]; then
            note="medians"
            [ "$n" = 1 ] && note="$note; served: a request's rate after its first token, in process: with its prompt read"
            echo "$n client(s): served ÷ in process $(ratio "$(median "${got[@]}")" "$auto") ($note)"
        fi
    done
fi

if [ -n "${LLAMA_SERVER:-}" ]; then
    echo "== ours / llama-server, tok/s (1 client: a request's; more: all clients' together), by round"
    for n in $clients; do
        line="$n client(s):" ratios=()
        for round in $(seq 1 "$rounds"); do
            ours=${rate["ours $round $n"]:-} native=${rate["native $round $n"]:-}
            line="$line  ${ours:-?} / ${native:-?}"
            [ -n "$native" ] && [ "$(wc -w <<<"$native_ks")" -gt 1 ] && line="$line (K=${best_k["$round $n"]})"
            if [ -n "$ours" ] && [ -n "$native" ]; then
                ratios+=("$(ratio "$ours" "$native")")
                line="$line = ${ratios[-1]}x"
            fi
        done
        [ "${#ratios[@]}" -gt 1 ] && line="$line; median $(printf "%.2f" "$(median "${ratios[@]}")")x"
        mapfile -t got < <(rates native "$n")
        read -r top _ <<<"$(ceiling "$n")"
        if [ -n "$top" ] && [ "${#got[@]}" -gt 0 ]; then  # no schedule of our engine passes its ceiling
            line="$line; the ceiling ÷ llama-server's median $(ratio "$top" "$(median "${got[@]}")")x at most"
        fi
        echo "$line"
    done
fi
