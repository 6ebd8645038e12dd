#!/usr/bin/env bash
# The pair served with slots, timed by 1 and 4 clients at once (make bench runs it after the in-process
# rows); with LLAMA_SERVER, llama.cpp's own server with the same draft next, measured the same way.
#   scripts/bench-serve.sh BIN TARGET DRAFT [serve flags...]     (OLLAMA_MODELS as for serve)
# BIN holds `python` and `ollama-spec` (a venv's bin). Environment, all optional:
#   CLIENTS="1 4"   the client counts, each a run of the bench prompts by that many clients at once
#   LLAMA_SERVER    a llama-server binary: serves the same two GGUF blobs, --spec-type draft-simple
#                   --spec-draft-n-max 6 -np 4 (issue #28's reference), after ours has stopped
#   SLOT_CTX=2048   each slot's context, for both servers (llama-server's -c is all slots' together)
#   THREADS         --threads / -t for both; NGL: llama-server's -ngl and -ngld (default 99 = all)
set -euo pipefail
bin=$1 target=$2 draft=$3
shift 3
clients=${CLIENTS:-1 4}
slot_ctx=${SLOT_CTX:-2048}
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

measure() {  # NAME: every client count against the server on $port
    for n in $clients; do
        echo "== $1, $n client(s) at once"
        "$bin/ollama-spec" bench "$target" --url "http://127.0.0.1:$port/v1" --runs 1 --max-tokens 96 \
            --concurrency "$n" | tail -2
    done
}

threads=()
[ -n "${THREADS:-}" ] && threads=(--threads "$THREADS")
"$bin/ollama-spec" serve "$target" --draft "$draft" --port "$port" --parallel 4 --ctx "$slot_ctx" "${threads[@]}" "$@" \
    >"$log" 2>&1 &
server=$!
wait_up "http://127.0.0.1:$port/health"
measure "ollama-spec serve --parallel 4"
stop

if [ -n "${LLAMA_SERVER:-}" ]; then
    blob() { "$bin/python" -c "from ollama_spec import resolve_model; print(resolve_model('$1').path)"; }
    ngl=${NGL:-99}
    "$LLAMA_SERVER" -m "$(blob "$target")" -md "$(blob "$draft")" --spec-type draft-simple --spec-draft-n-max 6 \
        -np 4 -c $((4 * slot_ctx)) -ngl "$ngl" -ngld "$ngl" --temp 0 ${THREADS:+-t "$THREADS"} \
        --host 127.0.0.1 --port "$port" >"$log" 2>&1 &
    server=$!
    wait_up "http://127.0.0.1:$port/health"
    measure "llama-server -np 4, the same draft"
    stop
fi
