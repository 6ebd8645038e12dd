#!/usr/bin/env bash
# The pair served with slots, timed by 1 and 4 clients at once (make bench runs it after the in-process rows).
#   scripts/bench-serve.sh BIN TARGET DRAFT [serve flags...]     (OLLAMA_MODELS as for serve)
set -euo pipefail
bin=$1 target=$2 draft=$3
shift 3
port=$("$bin/python" -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
log=$(mktemp)
"$bin/ollama-spec" serve "$target" --draft "$draft" --port "$port" --parallel 4 "$@" >"$log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null; wait $server 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 600); do
    if "$bin/python" -c "import httpx, sys; httpx.get('http://127.0.0.1:$port/health', timeout=1)" 2>/dev/null; then break; fi
    if ! kill -0 $server 2>/dev/null; then cat "$log" >&2; exit 1; fi
    sleep 0.5
done
for clients in 1 4; do
    echo "== serve --parallel 4, $clients client(s) at once"
    "$bin/ollama-spec" bench "$target" --url "http://127.0.0.1:$port/v1" --runs 1 --max-tokens 96 --concurrency "$clients" | tail -2
done
