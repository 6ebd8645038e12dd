"""Model names (or .gguf paths) -> everything needed to load and prompt the model."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ollama_spec.errors import InvalidManifest, ModelNotFound, NotGGUF, OllamaSpecError, UnusableModel
from ollama_spec.models.gguf_header import shown
from ollama_spec.models.gguf_info import ModelInfo, read_model_info
from ollama_spec.models.manifest import TooLarge, read_small
from ollama_spec.models.store import Store, StoredModel, blob_path, find_store_root
from ollama_spec.prompting.messages import ChatMessage

# A blob's own file name, as `show` prints it: given with a folder, it is a path, not a model name.
_BLOB_FILE = re.compile(r"sha256[-:][0-9a-f]{64}")


@dataclass(frozen=True)
class Listing:
    """A stored model as Ollama's /api/tags gives it, read with its manifest (so that /api/ps reads no
    file): the sha256 of the manifest's bytes, the size of every layer and the config, the manifest's mtime."""

    digest: str
    size: int
    modified: float


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
    # Ollama's adapter layers: GGUF LoRA adapters, applied over the weights in order as Ollama does
    adapters: tuple[ModelInfo, ...] = ()
    license: str | None = None  # Ollama's license layers, joined (what /api/show says)
    listing: Listing | None = None  # what /api/tags says of it (a .gguf file: its blob name's digest, if any)

    @property
    def adapter_paths(self) -> tuple[Path, ...]:
        return tuple(adapter.path for adapter in self.adapters)

    @property
    def loaded_info(self) -> ModelInfo:
        """`info` with the adapters' tensors too, which llama.cpp loads beside each block's weights: what
        the memory plan counts (their `blk.N.` names put them in their layers)."""
        if not self.adapters:
            return self.info
        extra = tuple(t for adapter in self.adapters for t in adapter.tensors)
        return replace(
            self.info,
            tensors=self.info.tensors + extra,
            tensor_bytes=self.info.tensor_bytes + sum(a.tensor_bytes for a in self.adapters),
        )


def looks_like_path(name: str) -> bool:
    """Whether `name` is meant as a file: it ends in .gguf, starts like a path, or is a blob's file name."""
    return (
        name.lower().endswith(".gguf")
        or name.startswith(("/", "./", "../", "~"))
        or ("/" in name and bool(_BLOB_FILE.fullmatch(Path(name).name)))
    )


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
        info = read_model_info(candidate)
        hex_name = candidate.name.removeprefix("sha256-") if _BLOB_FILE.fullmatch(candidate.name) else ""
        return ResolvedModel(candidate.name, candidate, info, listing=_listing(candidate, hex_name, info.file_size))
    store = store or Store(find_store_root(models_dir))
    return resolve_stored(store.resolve(name))


def resolve_stored(stored: StoredModel) -> ResolvedModel:
    """A stored model, its manifest already read (Store.resolve), as a ResolvedModel: its GGUF header and
    its layers read, and its name not looked up in the store again."""
    info = stored.model_info()
    adapters = tuple(
        lora_adapter(blob_path(stored.root, layer.digest), info, f"{stored.name}'s adapter layer")
        for layer in stored.layers
        if layer.kind == "adapter"
    )
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
        adapters=adapters,
        license=_licenses(stored),
        listing=_listing(
            stored.manifest_path,
            stored.digest or None,
            stored.size + (stored.config_layer.size if stored.config_layer else 0),
        ),
    )


def _listing(path: Path, digest: str | None, size: int) -> Listing | None:
    """The Listing of a manifest (`digest` None: its bytes' sha256) or of a GGUF file."""
    try:
        modified = path.stat().st_mtime
        digest = hashlib.sha256(read_small(path)).hexdigest() if digest is None else digest
    except (OSError, TooLarge):  # changed since it was read: listed without
        return None
    return Listing(digest, size, modified)


def _licenses(stored) -> str | None:
    """The license layers' texts, joined as Ollama joins them; a license that cannot be read is
    left out rather than keeping the model from running (it is only ever shown)."""
    texts = []
    for layer in stored.layers:
        if layer.kind == "license":
            try:
                texts.append(stored.layer_text(layer))
            except OllamaSpecError:
                continue
    return "\n".join(texts) or None


def lora_adapter(path: Path, base: ModelInfo, owner: str) -> ModelInfo:
    """A LoRA adapter's header, checked as llama.cpp checks it, before any weights are loaded
    (`owner`: what the errors call it)."""
    try:
        adapter = read_model_info(path, read_vocab=False)
    except OllamaSpecError as exc:
        raise type(exc)(f"{owner}: {exc}") from None
    if (adapter.metadata.get("general.type"), adapter.metadata.get("adapter.type")) != ("adapter", "lora"):
        raise UnusableModel(
            f"{owner} is not a GGUF LoRA adapter, the only kind llama.cpp applies (convert it "
            "with llama.cpp's convert_lora_to_gguf.py)"
        )
    if adapter.architecture != base.architecture:
        raise UnusableModel(
            f"{owner} is a LoRA adapter for {shown(adapter.architecture)} models, but the model is "
            f"{shown(base.architecture)}"
        )
    if problem := _lora_mismatch(adapter, base):
        raise UnusableModel(f"{owner} does not fit the model: {problem} (a LoRA made for another base model?)")
    return adapter


def _lora_mismatch(adapter: ModelInfo, base: ModelInfo) -> str | None:
    """What llama.cpp's adapter loader would refuse, from the two headers: every `X.lora_a`/`X.lora_b`
    pair must change a tensor X of the model, A being n_in x r and B r x n_out (ggml order; the
    token embeddings' pair the other way round)."""
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    for tensor in adapter.tensors:
        name, _, part = tensor.name.rpartition(".")
        if part in ("lora_a", "lora_b"):
            pairs.setdefault(name, {})[part] = tensor.shape
        elif not tensor.name.endswith("_norm.weight"):  # norms are skipped by llama.cpp
            return f"its tensor {shown(tensor.name)} is no LoRA matrix"
    shapes = {tensor.name: tensor.shape for tensor in base.tensors}
    for name, pair in pairs.items():
        if len(pair) < 2:
            return f"it has only one of {shown(name)}'s two LoRA matrices"
        if name not in shapes:
            return f"it changes {shown(name)}, which the model does not have"
        (a, b), w = (pair["lora_a"], pair["lora_b"]), shapes[name]
        if len(a) < 2 or len(b) < 2 or len(w) < 2:
            return f"{shown(name)} is not a matrix"
        fits = (
            (w[0] == b[1] and w[1] == a[1])
            if name.endswith("token_embd.weight")
            else (w[0] == a[0] and w[1] == b[1] and a[1] == b[0])
        )
        if not fits:
            return f"its {shown(name)} change is {a[0]}x{b[1]}, the model's matrix {w[0]}x{w[1]}"
    return None


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
    return (
        f"{model.name} has no chat template in its GGUF, only an Ollama template layer (Go templates are not "
        f"supported): the conversation is sent unformatted; {advice}"
    )


def _messages(stored: StoredModel) -> tuple[ChatMessage, ...]:
    """Ollama's messages layer, `[{"role": ..., "content": ...}, ...]`, as chat messages."""
    text = stored.text_layer("messages")
    if not text:
        return ()
    try:
        raw = json.loads(text)
    except (ValueError, RecursionError):
        raise InvalidManifest(f"{stored.name}: its messages layer is not valid JSON") from None
    if not isinstance(raw, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content", ""), str) for m in raw
    ):
        raise InvalidManifest(f"{stored.name}: its messages layer is not a list of role/content messages")
    try:
        return tuple(ChatMessage(m["role"], m.get("content", "")) for m in raw)
    except OllamaSpecError as exc:
        raise InvalidManifest(f"{stored.name}: its messages layer: {exc}") from None
