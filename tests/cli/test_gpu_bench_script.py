"""scripts/gpu-bench.sh end to end with the CPU backend and the toy-size nested pair (what a GPU run does)."""

import json
import os
import shutil
import subprocess
import sys
import tarfile
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


def fake_prebuilt_bundle(bundle: Path, marker: Path) -> None:
    """gpu-bundle/ as scripts/make-gpu-prebuilt.sh leaves it (cuda.tar.xz), with this venv's llama_cpp (CPU libraries)
    in place of the CUDA build; its llama_cpp notes in `marker` that it was the one imported."""
    import llama_cpp

    site = bundle / "cuda" / "site"
    subprocess.run(["cp", "-r", str(Path(llama_cpp.__file__).parent), str(site / "llama_cpp")], check=True)
    with (site / "llama_cpp" / "__init__.py").open("a") as init:
        init.write(f"\nopen({str(marker)!r}, 'a').write(__file__ + '\\n')\n")
    (bundle / "wheels").mkdir()  # offline: pip finds everything installed already
    with tarfile.open(bundle / "cuda.tar.xz", "w:xz", preset=0) as packed:  # carried compressed, as made
        packed.add(bundle / "cuda", arcname="cuda")
    shutil.rmtree(bundle / "cuda")


@pytest.mark.slow
def test_a_prebuilt_bundle_is_imported_first_and_its_session_is_written_out(tmp_path):
    session = SCRIPT.with_name("gpu-session.sh")
    (site := tmp_path / "bundle" / "cuda" / "site").mkdir(parents=True)
    marker = tmp_path / "imported"
    fake_prebuilt_bundle(tmp_path / "bundle", marker)
    env = {name: value for name, value in os.environ.items() if name != "LLAMA_SERVER"} | {
        "PYTHON": sys.executable,
        "GPU_BUNDLE": str(tmp_path / "bundle"),
        "GPU_BENCH_WORK": str(tmp_path / "work"),
        "GPU_BENCH_ARGS": "-k 2 -n 8 --runs 1 --no-warmup --threads 1",
        "GPU_COMMIT": "abc123",
        "MAX_TOKENS": "8",
    }
    out = tmp_path / "out"
    result = subprocess.run(
        ["bash", str(session), str(out), "--cpu", "--tiny"], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:]
    assert str(site / "llama_cpp" / "__init__.py") in marker.read_text()  # not the venv's own
    assert {"device.txt", "gpu-bench.log", "bench.txt", "serve.txt", "offload.txt", "results.json"} <= {
        path.name for path in out.iterdir()
    }
    assert "commit: abc123" in (out / "device.txt").read_text()

    docs = tmp_path / "docs"
    subprocess.run([sys.executable, str(SCRIPT.with_name("gpu_results.py")), str(out), str(docs)], check=True)
    results = json.loads((docs / "results.json").read_text())
    assert results["device"]["commit"] == "abc123"
    assert results["bench"]["draft"] == "nested-draft:q8_0"
    assert any("offloaded 0/5 layers" in line for line in results["offload"])
    assert "| speculative K=2 |" in (docs / "results.md").read_text()


def test_the_served_ratios_are_read_round_by_round():
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from gpu_results import served_ratios
    finally:
        sys.path.remove(str(SCRIPT.parent))
    text = (  # scripts/bench-serve.sh's closing lines, the first with two of llama-server's draft lengths
        "1 client(s): served ÷ in process 0.96 (median of 2)\n== ours / llama-server, tok/s, by round\n"
        "1 client(s):  341.4 / 88.5 (K=6) = 3.86x  300.0 / 100.0 (K=4) = 3.00x; median 3.43x\n"
        "4 client(s):  488.2 / 159.5 = 3.06x\n"
    )
    assert served_ratios(text) == {
        "1": [
            {"ours": 341.4, "llama_server": 88.5, "llama_server_k": 6, "ratio": 3.86},
            {"ours": 300.0, "llama_server": 100.0, "llama_server_k": 4, "ratio": 3.0},
        ],
        "4": [{"ours": 488.2, "llama_server": 159.5, "llama_server_k": None, "ratio": 3.06}],
    }
