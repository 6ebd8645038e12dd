"""How a pull runs: which path, plain HTTP or not, how many blobs at once."""

from __future__ import annotations

from dataclasses import dataclass

from ollama_spec.models.daemon import ollama_host

VIAS = ("ollama", "registry", "hf")
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
        """The daemon's URL: --host, else $OLLAMA_HOST, as Ollama reads them."""
        return ollama_host(self.ollama_host)
