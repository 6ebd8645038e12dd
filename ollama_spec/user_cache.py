"""Where ollama-spec keeps what it measured about this machine (never inside Ollama's store)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/ollama-spec, else ~/.cache/ollama-spec."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ollama-spec"
