"""`pip install .` builds ollama-spec with today's metadata (PEP 639) and no warning from setuptools."""

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_builds_without_a_deprecation_warning_and_carries_the_license(tmp_path):
    source = tmp_path / "src"  # a copy: an in-tree build would leave build/ and *.egg-info here
    shutil.copytree(ROOT / "ollama_spec", source / "ollama_spec", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(source)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert "deprecat" not in (result.stdout + result.stderr).lower()
    (wheel,) = (tmp_path / "dist").glob("ollama_spec-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        metadata = next(archive.read(n).decode() for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        licenses = [n for n in archive.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    assert "License-Expression: MIT\n" in metadata and "License-File: LICENSE\n" in metadata
    assert licenses
