"""The server's settings: where it listens, who may call it, and each request's defaults."""

from __future__ import annotations

from dataclasses import dataclass

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.errors import InvalidSetting

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_QUEUE = 64
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ServerSettings:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    api_key: str | None = None
    aliases: tuple[str, ...] = ()  # --served-model-name: more names /v1/models lists
    max_queue: int = DEFAULT_MAX_QUEUE
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    origins: tuple[str, ...] = ()  # web pages whose scripts may call us, beside localhost's (OLLAMA_ORIGINS)
    # Per-request defaults: the command's flags, else the model's Ollama params, else Ollama's.
    sampling: SamplingSettings = SamplingSettings()
    speculation: SpeculationSettings = SpeculationSettings()
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None  # None: up to the end of the context

    def __post_init__(self) -> None:
        if self.max_queue < 0:
            raise InvalidSetting(f"--max-queue must be >= 0, got {self.max_queue}")
        if not 0 <= self.port <= 65535:
            raise InvalidSetting(f"--port must be in 0..65535, got {self.port}")
