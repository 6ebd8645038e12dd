#!/usr/bin/env bash
# -k auto on pairs it was not tuned on: each pair's target alone, auto and
# fixed K=2,3,5,8, greedy, interleaved runs, in one `bench` process per pair; then the hybrid
# (--draft MODEL --ngram) against draft-only and n-gram-only on the rewrite prompts, with the copy pair
# (a target that repeats its input, and a draft that writes the rest) and the strong pair.
#   scripts/bench-auto-k.sh [BIN] [STORE]     (defaults: .venv/bin, bench-results/auto-k-store)
# Pairs (ollama_spec/synthetic/catalog.py): strong (F16, a draft that agrees on most tokens),
# weak (F16, a 2-layer draft that agrees on about half), quant (Q4_0 target + Q8_0 draft: compute-
# bound on a CPU, where drafting does not pay). About 15 minutes on a 2-core CPU.
set -euo pipefail
bin=${1:-.venv/bin}
store=${2:-bench-results/auto-k-store}
tokens=${AUTO_K_TOKENS:-192}
runs=${AUTO_K_RUNS:-2}
"$bin/python" - "$store" <<'PY'
import sys
from pathlib import Path
from ollama_spec.synthetic import build_pair_store
from ollama_spec.synthetic.copying import build_copy_pair_store
for pair in ("strong", "weak", "quant"):
    build_pair_store(Path(sys.argv[1]), pair, progress=lambda message: print(message, file=sys.stderr))
build_copy_pair_store(Path(sys.argv[1]))
PY
export OLLAMA_MODELS=$store
for pair in strong-target,strong-draft weak-target,weak-draft quant-target:q4_0,quant-draft:q8_0; do
    target=${pair%,*} draft=${pair#*,}
    # The quant pair's answers take 0.4 s, where this VM's drift between rows is 5-10 %: twice the
    # runs (2 minutes more) for rows as comparable as the slower pairs' are in 2.
    pair_runs=$runs
    [[ $target == quant-* ]] && pair_runs=$((2 * runs))
    echo "== $target with $draft: -k auto against the target alone and fixed K"
    "$bin/ollama-spec" bench "$target" --draft "$draft" -k auto,2,3,5,8 --max-tokens "$tokens" --runs "$pair_runs" \
        --threads 2
done
echo "== copy pair (a target that copies its input, synthetic/copying.py) on the rewrite prompts: the hybrid"
"$bin/ollama-spec" bench copy-target --draft copy-draft -k auto,4 --prompts rewrite --max-tokens "$tokens" \
    --runs "$runs" --threads 2
echo "== strong pair on the rewrite prompts: draft model, prompt lookup, both (hybrid)"
"$bin/ollama-spec" bench strong-target --draft strong-draft -k auto,5 --prompts rewrite --max-tokens "$tokens" \
    --runs "$runs" --threads 2
