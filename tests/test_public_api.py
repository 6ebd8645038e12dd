"""What the docs import from `ollama_spec` itself keeps working, and importing it stays light."""

import subprocess
import sys

import ollama_spec


def test_every_public_name_imports_from_the_package():
    for name in ollama_spec.PUBLIC:
        assert getattr(ollama_spec, name).__name__ == name


def test_importing_the_package_loads_nothing_heavy():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, ollama_spec; print(' '.join(sys.modules))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert not {"numpy", "llama_cpp", "fastapi", "jinja2"} & set(loaded)
