"""Shared fixtures: every user path points into tmp, and one tiny synthetic store per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from ollama_spec.synthetic import build_pair_store


@pytest.fixture(autouse=True)
def isolated_user_paths(tmp_path, monkeypatch):
    """No test may see the real ~/.ollama or OLLAMA_MODELS."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    return home


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("store")
    build_pair_store(root, "tiny")
    return root


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def invoke(runner):
    """Run the CLI like a user would; returns click's Result."""
    from ollama_spec.cli import cli

    def run(*args: str, **kwargs):
        return runner.invoke(cli, [str(a) for a in args], **kwargs)

    return run
