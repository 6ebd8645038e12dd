"""Where ollama-spec reads its settings: Ollama's environment variables, read as Ollama reads them, and
the folder where it keeps what it measured about this machine (never inside Ollama's store).

Ollama's envconfig.Var trims spaces and then quotes, so values quoted in a systemd
`Environment=` line or a `.env` file (OLLAMA_MODELS="/data/ollama") work there; they must here too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def ollama_var(key: str, environ: Mapping[str, str] | None = None) -> str:
    """`key`'s value as Ollama sees it: strings.Trim(strings.TrimSpace(v), "\\"'"); "" when unset."""
    value = (os.environ if environ is None else environ).get(key) or ""
    return value.strip().strip("\"'")


def cache_dir() -> Path:
    """$XDG_CACHE_HOME/ollama-spec, else ~/.cache/ollama-spec."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ollama-spec"
