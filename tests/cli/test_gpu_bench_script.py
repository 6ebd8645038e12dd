"""scripts/gpu-bench.sh end to end with the CPU backend and the toy-size nested pair (what a GPU run does)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "gpu-bench.sh"


@pytest.mark.slow
def test_the_gpu_bench_script_runs_every_step_on_the_cpu(tmp_path):
    env = {name: value for name, value in os.environ.items() if name != "LLAMA_SERVER"} | {
        "PYTHON": sys.executable,
        "GPU_BENCH_WORK": str(tmp_path / "work"),
        "GPU_BENCH_ARGS": "-k 2 -n 8 --runs 1 --no-warmup --threads 1",
        "MAX_TOKENS": "8",  # the serve step's requests (scripts/bench-serve.sh), as short as the bench's
    }
    result = subprocess.run(
        ["bash", str(SCRIPT), "--cpu", "--tiny", "--no-build"], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    steps = [line.split(") ", 1)[1] for line in result.stderr.splitlines() if line.startswith("== ")]
    assert steps[:5] == [
        f"synthetic pair (tiny) in {tmp_path / 'work' / 'store-tiny'}",
        "check against this machine",
        "full offload, from llama.cpp's load log",
        "bench -k 2 -n 8 --runs 1 --no-warmup --threads 1",
        "serve --parallel 4, 1 and 4 clients",  # no LLAMA_SERVER, no --llama-server: ours only
    ]
    out = result.stdout
    assert "target  nested-target:q4_k_m: offloaded 0/5 layers to GPU" in out and "in RAM: llama.cpp " in out
    lines = out.splitlines()
    table = next(i for i, line in enumerate(lines) if line.startswith("row "))
    served = lines.index("== ollama-spec serve --parallel 4, 4 client(s) at once")
    assert next(i for i, line in enumerate(lines) if "offloaded" in line) < table < served
    assert any(line.startswith("speculative K=2 ") for line in lines[table:served])
    assert any(line.startswith("4 clients at once: ") for line in lines[served:])
    assert not any("llama-server" in line for line in lines)
    assert (tmp_path / "work" / "bench-tiny-cpu" / "results.json").exists()
