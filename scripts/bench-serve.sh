#!/usr/bin/env bash
# The pair served with slots, timed by 1 and 4 clients at once (make bench runs it after the in-process
# rows); with LLAMA_SERVER, llama.cpp's own server with the same draft next, measured the same way.
#   scripts/bench-serve.sh BIN TARGET DRAFT [serve flags...]     (OLLAMA_MODELS as for serve)
# BIN holds `python` and `ollama-spec` (a venv's bin). Environment, all optional:
#   CLIENTS="1 4"   the client counts, each a run of the bench prompts by that many clients at once
#   ROUNDS=1        rounds of ours then llama-server: this machine's speed drifts, a ratio per round holds
#   LLAMA_SERVER    a llama-server binary: serves the same two GGUF blobs, --spec-type draft-simple
#                   (draft-eagle3 when DRAFT is an EAGLE-3 head; with DRAFT mtp, the target's blob alone
#                   and draft-mtp) --spec-draft-n-max K -np 4, after ours has stopped
#   K               the draft length for both servers (ours: -k K); unset: ours chooses, llama-server 6
#                   (its best draft length on the demo pair)
#   SLOT_CTX=2048   each slot's context, for both servers (llama-server's -c is all slots' together)
#   MAX_TOKENS=96   each request's max_tokens (fewer: a quick check that every step runs)
#   THREADS         --threads / -t for both; NGL: llama-server's -ngl and -ngld (default 99 = all)
#   CEILING         a results-concurrent.json of `bench --concurrency N --in-process`: each rate is also
#                   given as a share of the ideal schedule's ceiling at that client count
set -euo pipefail
if [ $# -lt 3 ]; then echo "usage: scripts/bench-serve.sh BIN TARGET DRAFT [serve flags...]" >&2; exit 2; fi
bin=$1 target=$2 draft=$3
shift 3
if [ -n "${LLAMA_SERVER:-}" ] && [ ! -x "$LLAMA_SERVER" ]; then
    echo "LLAMA_SERVER=$LLAMA_SERVER is not an executable (scripts/build-native-speculative.sh builds one)" >&2
    exit 2
fi
clients=${CLIENTS:-1 4}
slot_ctx=${SLOT_CTX:-2048}
max_tokens=${MAX_TOKENS:-96}
port=$("$bin/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
log=$(mktemp)
server=
stop() { if [ -n "$server" ]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi; server=; }
trap 'stop; rm -f "$log"' EXIT

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

measure() {  # KEY NAME ROUND: every client count against the server on $port
    local n out
    for n in $clients; do
        echo "== $2, $n client(s) at once${rounds_note}"
        out=$("$bin/ollama-spec" bench "$target" --url "http://127.0.0.1:$port/v1" --runs 1 --max-tokens "$max_tokens" \
            --concurrency "$n" | tail -2)
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
for round in $(seq 1 "$rounds"); do
    rounds_note=""
    [ "$rounds" -gt 1 ] && rounds_note=" (round $round of $rounds)"
    "$bin/ollama-spec" serve "$target" --draft "$draft" --port "$port" --parallel 4 --ctx "$slot_ctx" \
        "${threads[@]}" "${ours_k[@]}" "$@" >"$log" 2>&1 &
    server=$!
    wait_up "http://127.0.0.1:$port/health"
    measure ours "ollama-spec serve --parallel 4" "$round"
    stop

    if [ -n "${LLAMA_SERVER:-}" ]; then
        ngl=${NGL:-99}
        "$LLAMA_SERVER" -m "$(blob "$target")" "${native_draft[@]}" --spec-draft-n-max "${K:-6}" \
            -np 4 -c $((4 * slot_ctx)) -ngl "$ngl" --temp 0 ${THREADS:+-t "$THREADS"} \
            --host 127.0.0.1 --port "$port" >"$log" 2>&1 &
        server=$!
        wait_up "http://127.0.0.1:$port/health"
        measure native "llama-server -np 4, the same draft" "$round"
        stop
    fi
done

ceiling() {  # the ideal schedule's tok/s at $1 clients, from $CEILING; empty if none
    [ -n "${CEILING:-}" ] && [ -f "$CEILING" ] || return 0
    "$bin/python" -c "import json, sys; c = json.load(open(sys.argv[1]))['ceiling'].get(sys.argv[2]); print(f'{c:.1f}' if c else '')" \
        "$CEILING" "$1"
}
if [ -n "${CEILING:-}" ] && [ -f "$CEILING" ]; then
    echo "== share of the ideal schedule's ceiling ($CEILING), by round"
    for n in $clients; do
        top=$(ceiling "$n")
        [ -n "$top" ] || continue
        line="$n client(s), ceiling $top tok/s:"
        for round in $(seq 1 "$rounds"); do
            for who in ours native; do
                r=${rate["$who $round $n"]:-}
                [ -n "$r" ] && line="$line  $who $(awk -v a="$r" -v b="$top" 'BEGIN { printf "%.2f", a / b }')"
            done
        done
        echo "$line"
    done
fi

if [ -n "${LLAMA_SERVER:-}" ]; then
    echo "== ours / llama-server, tok/s (1 client: a request's; more: all clients' together), by round"
    for n in $clients; do
        line="$n client(s):"
        for round in $(seq 1 "$rounds"); do
            ours=${rate["ours $round $n"]:-} native=${rate["native $round $n"]:-}
            line="$line  ${ours:-?} / ${native:-?}"
            if [ -n "$ours" ] && [ -n "$native" ]; then
                line="$line = $(awk -v a="$ours" -v b="$native" 'BEGIN { printf "%.2fx", a / b }')"
            fi
        done
        echo "$line"
    done
fi
