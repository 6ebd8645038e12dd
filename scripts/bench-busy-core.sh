#!/usr/bin/env bash
# -k auto beside the fixed Ks while another process keeps one core busy (a policy that learns its
# costs from the clock must not lock onto a noisy stretch). The in-process bench, its rows interleaved, with a
# spinning process started before and stopped after, however the bench ends.
#   scripts/bench-busy-core.sh BIN TARGET DRAFT [bench flags...]     (OLLAMA_MODELS as for bench)
# Default flags: --concurrency $CLIENTS (default 1) --in-process -k auto,2,4,6 --runs 3 --max-tokens 128.
set -euo pipefail
if [ $# -lt 3 ]; then echo "usage: scripts/bench-busy-core.sh BIN TARGET DRAFT [bench flags...]" >&2; exit 2; fi
bin=$1 target=$2 draft=$3
shift 3
"$bin/python" -c "while True: pass" &
spinner=$!
trap 'kill "$spinner" 2>/dev/null || true' EXIT
echo "== one core kept busy by process $spinner while the rows run" >&2
"$bin/ollama-spec" bench "$target" --draft "$draft" --concurrency "${CLIENTS:-1}" --in-process -k auto,2,4,6 --runs 3 --max-tokens 128 "$@"
