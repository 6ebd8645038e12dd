"""How a pull runs: which path, plain HTTP or not, how many blobs at once."""

from __future__ import annotations

from dataclasses import dataclass

from ollama_spec.config import ollama_var

VIAS = ("ollama", "registry", "hf")
DEFAULT_OLLAMA_HOST = "http://127.0.0.1:11434"
DEFAULT_CONCURRENCY = 4


@dataclass(frozen=True)
class PullSettings:
    """`via` None chooses automatically: the daemon if it answers, else Hugging Face or the registry."""

    via: str | None = None
    insecure: bool = False
    concurrency: int = DEFAULT_CONCURRENCY
    ollama_host: str | None = None

    @property
    def daemon_host(self) -> str:
        return self.ollama_host or ollama_var("OLLAMA_HOST") or DEFAULT_OLLAMA_HOST
