"""The seam sets libgomp's spin before llama.cpp loads, and keeps a user's own setting."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ollama_spec.llama import SPIN_COUNT

READ = "import os, ollama_spec.llama.model; print(os.environ.get('GOMP_SPINCOUNT'))"


def _spin(env: dict[str, str]) -> str:
    base = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")}
    run = subprocess.run([sys.executable, "-c", READ], env=base | env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_the_seam_sets_a_short_spin_before_llama_cpp_loads():
    assert _spin({}) == SPIN_COUNT


@pytest.mark.parametrize(("env", "seen"), [({"GOMP_SPINCOUNT": "5"}, "5"), ({"OMP_WAIT_POLICY": "active"}, "None")])
def test_a_users_own_openmp_setting_is_kept(env, seen):
    assert _spin(env) == seen
