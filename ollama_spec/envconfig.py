"""Ollama's environment variables, read as Ollama reads them.

Ollama's envconfig.Var trims spaces and then quotes, so values quoted in a systemd
`Environment=` line or a `.env` file (OLLAMA_MODELS="/data/ollama") work there; they must here too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def ollama_var(key: str, environ: Mapping[str, str] | None = None) -> str:
    """`key`'s value as Ollama sees it: strings.Trim(strings.TrimSpace(v), "\\"'"); "" when unset."""
    value = (os.environ if environ is None else environ).get(key) or ""
    return value.strip().strip("\"'")
