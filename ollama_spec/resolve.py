"""Model names (or .gguf paths) -> everything needed to load and prompt the model."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .gguf_info import ModelInfo, read_model_info
from .store import Store, find_store_root


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: Path
    info: ModelInfo
    params: dict[str, Any] = field(default_factory=dict)  # Ollama's params layer
    system: str | None = None  # Ollama's system layer


def gguf_file(name: str) -> Path | None:
    """`name` as a path to an existing .gguf file, or None when it is a model name."""
    candidate = Path(name).expanduser()
    return candidate if name.lower().endswith(".gguf") and candidate.is_file() else None


def resolve_model(name: str, models_dir: str | None = None, store: Store | None = None) -> ResolvedModel:
    """Resolve an Ollama model name; a path to an existing .gguf file is used as it is."""
    candidate = gguf_file(name)
    if candidate is not None:
        return ResolvedModel(name=candidate.name, path=candidate, info=read_model_info(candidate))
    store = store or Store(find_store_root(models_dir))
    stored = store.resolve(name)
    info = stored.model_info()
    return ResolvedModel(
        name=stored.name,
        path=info.path,
        info=info,
        params=stored.params(),
        system=stored.text_layer("system"),
    )
