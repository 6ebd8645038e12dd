"""scripts/bench-serve.sh with CEILING=measure: the ideal schedule of the served requests, measured in process
first, beside what the server made (the tiny pair, a few tokens, ours only)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "bench-serve.sh"


def shims(bin_dir: Path) -> Path:
    """BIN as the script wants it: `python`, and `ollama-spec` running this checkout."""
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f'#!/usr/bin/env bash\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "ollama-spec").write_text(
        f'#!/usr/bin/env bash\nPYTHONPATH="{ROOT}" exec "{sys.executable}" -m ollama_spec "$@"\n'
    )
    for shim in bin_dir.iterdir():
        shim.chmod(0o755)
    return bin_dir


@pytest.mark.slow
def test_the_measured_ceiling_is_read_at_the_slots_the_clients_share(tiny_store, tmp_path):
    env = {name: value for name, value in os.environ.items() if name not in ("LLAMA_SERVER", "NATIVE_KS", "K")} | {
        "OLLAMA_MODELS": str(tiny_store),
        "CLIENTS": "1 3",
        "PARALLEL": "2",
        "MAX_TOKENS": "4",
        "THREADS": "1",
        "CEILING": "measure",
        "CEILING_K": "2",
        "CEILING_ROUNDS": "2",
    }
    result = subprocess.run(
        ["bash", str(SCRIPT), str(shims(tmp_path / "bin")), "tiny-target", "tiny-draft", "--no-check"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert lines[0] == "== the ceiling: bench --concurrency 2 --in-process, 4 tokens a request, 2 rounds"
    # the server is warmed by the prompt set before its first count is timed, as the in-process rows are
    warm = lines.index("== ollama-spec serve --parallel 2: warm-up, the prompts by 2 client(s) at once, untimed")
    assert warm < lines.index("== ollama-spec serve --parallel 2, 1 client(s) at once")
    assert "== ollama-spec serve --parallel 2, 3 client(s) at once" in lines
    shares = [line for line in lines if re.match(r"\d client\(s\), ceiling", line)]
    number = r"[\d.]+"
    for clients, line in zip((1, 3), shares, strict=True):  # 3 clients queue for 2 slots: the 2-slot ceiling
        assert re.fullmatch(
            rf"{clients} client\(s\), ceiling {number} tok/s \(in process, -k auto: {number}, {number}\):  ours {number}",
            line,
        ), line
    ceilings = [float(line.split()[3]) for line in shares]
    assert ceilings[0] != ceilings[1]  # one slot's ceiling, then two slots'
    assert any(line.startswith("3 client(s): served ÷ in process ") for line in lines)
    assert not any("llama-server" in line for line in lines)
