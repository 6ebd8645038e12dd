"""Model names (or .gguf paths) -> everything needed to load and prompt the model."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .chat import ChatMessage
from .errors import InvalidManifest, ModelNotFound, NotGGUF, OllamaSpecError, UnusableModel
from .gguf_info import ModelInfo, read_model_info
from .store import Store, StoredModel, blob_path, find_store_root

# A blob's own file name, as `show` prints it: given with a folder, it is a path, not a model name.
_BLOB_FILE = re.compile(r"sha256[-:][0-9a-f]{64}")


@dataclass(frozen=True)
class ResolvedModel:
    name: str
    path: Path
    info: ModelInfo
    params: dict[str, Any] = field(default_factory=dict)  # Ollama's params layer
    system: str | None = None  # Ollama's system layer
    messages: tuple[ChatMessage, ...] = ()  # Ollama's messages layer: a Modelfile's MESSAGE history
    go_template: bool = False  # Ollama's template (or legacy prompt) layer: a Go template, not run here
    stored_draft: Path | None = None  # the blob of Ollama's draft layer: the draft the manifest names


def looks_like_path(name: str) -> bool:
    """Whether `name` is meant as a file: it ends in .gguf, starts like a path, or is a blob's file name."""
    return (name.lower().endswith(".gguf") or name.startswith(("/", "./", "../", "~"))
            or ("/" in name and bool(_BLOB_FILE.fullmatch(Path(name).name))))


def gguf_file(name: str) -> Path | None:
    """`name` as a path to a GGUF file, or None when it is a model name; a path to nothing is an error."""
    if not looks_like_path(name):
        return None
    candidate = Path(name).expanduser()
    try:
        if candidate.is_file():
            return candidate
        if candidate.is_dir():
            raise NotGGUF(f"{name} is a directory, not a GGUF file")
    except OSError as exc:
        raise NotGGUF(f"cannot read {name}: {exc.strerror or exc}") from None
    raise ModelNotFound(f"no such file: {name}")


def resolve_model(name: str, models_dir: str | None = None, store: Store | None = None) -> ResolvedModel:
    """Resolve an Ollama model name; a path to an existing .gguf file is used as it is."""
    candidate = gguf_file(name)
    if candidate is not None:
        return ResolvedModel(name=candidate.name, path=candidate, info=read_model_info(candidate))
    store = store or Store(find_store_root(models_dir))
    stored = store.resolve(name)
    if stored.layer("adapter") is not None:
        # Ollama applies the adapter; the base weights alone would answer under the fine-tune's name.
        raise UnusableModel(f"{stored.name} has a LoRA adapter layer, which ollama-spec does not apply: "
                            "its output would not be that model's")
    info = stored.model_info()
    draft = stored.layer("draft")
    return ResolvedModel(
        name=stored.name,
        path=info.path,
        info=info,
        params=stored.params(),
        system=stored.text_layer("system"),
        messages=_messages(stored),
        go_template=stored.layer("template") is not None or stored.layer("prompt") is not None,
        stored_draft=blob_path(stored.root, draft.digest) if draft is not None else None,
    )


def stored_draft_model(target: ResolvedModel) -> ResolvedModel:
    """The draft that `target`'s manifest carries (Ollama's DRAFT layer), header read."""
    assert target.stored_draft is not None
    try:
        info = read_model_info(target.stored_draft)
    except OllamaSpecError as exc:
        raise type(exc)(f"{target.name}'s draft layer: {exc}") from None
    return ResolvedModel(name=f"{target.name} (its draft layer)", path=target.stored_draft, info=info)


def template_warning(model: ResolvedModel, advice: str) -> str | None:
    """A warning when prompts would go unformatted: no chat template in the GGUF, only Ollama's Go one."""
    if not model.go_template or model.info.chat_template:
        return None
    return (f"{model.name} has no chat template in its GGUF, only an Ollama template layer (Go templates are not "
            f"supported): the conversation is sent unformatted; {advice}")


def _messages(stored: StoredModel) -> tuple[ChatMessage, ...]:
    """Ollama's messages layer, `[{"role": ..., "content": ...}, ...]`, as chat messages."""
    text = stored.text_layer("messages")
    if not text:
        return ()
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidManifest(f"{stored.name}: its messages layer is not valid JSON") from None
    if not isinstance(raw, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                            and isinstance(m.get("content", ""), str) for m in raw):
        raise InvalidManifest(f"{stored.name}: its messages layer is not a list of role/content messages")
    try:
        return tuple(ChatMessage(m["role"], m.get("content", "")) for m in raw)
    except OllamaSpecError as exc:
        raise InvalidManifest(f"{stored.name}: its messages layer: {exc}") from None
