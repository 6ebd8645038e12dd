"""Read-only access to Ollama's model store: root, manifests, layers, blobs.

Layout (from Ollama's source): `<root>/manifests/<host>/<namespace>/<model>/<tag>` holds a JSON
manifest whose layers point at `<root>/blobs/sha256-<hex>`. Nothing here ever writes.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import BlobError, InvalidManifest, ModelNotFound, NotGGUF, StoreNotFound, StoreUnreadable
from .gguf_info import is_gguf
from .names import ModelRef, parse_model_name

MEDIA_TYPE_PREFIX = "application/vnd.ollama.image."
LAYER_KINDS = (
    "model",
    "projector",
    "adapter",
    "template",
    "system",
    "params",
    "messages",
    "license",
    "draft",
    "tensor",
)
HOME_STORE = Path("~/.ollama/models")
SERVICE_STORE = Path("/usr/share/ollama/.ollama/models")
_DIGEST = re.compile(r"sha256:([0-9a-f]{64})")
_HASH_CHUNK = 8 << 20


@dataclass(frozen=True)
class StoreRoot:
    path: Path
    source: str  # where the path came from, for messages: "--models-dir", "OLLAMA_MODELS", ...


@dataclass(frozen=True)
class Layer:
    media_type: str
    digest: str
    size: int

    @property
    def kind(self) -> str:
        """`model`, `template`, ... for Ollama's own media types, else the full media type."""
        return self.media_type.removeprefix(MEDIA_TYPE_PREFIX)


@dataclass(frozen=True)
class StoredModel:
    """One manifest in the store, with its layers; `gguf_path` is the model blob."""

    ref: ModelRef
    manifest_path: Path
    root: Path
    config: Mapping[str, Any]
    layers: tuple[Layer, ...]

    @property
    def name(self) -> str:
        return self.ref.display

    def layer(self, kind: str) -> Layer | None:
        return next((layer for layer in self.layers if layer.kind == kind), None)

    @property
    def size(self) -> int:
        return sum(layer.size for layer in self.layers)

    @property
    def gguf_path(self) -> Path:
        """Path of the GGUF model blob, checked to exist with the manifest's size and magic."""
        layer = self.layer("model")
        if layer is None:
            raise NotGGUF(f"{self.name} is not a GGUF model: {self._why_no_model_layer()}")
        path = blob_path(self.root, layer.digest)
        check_blob(path, layer)
        if not is_gguf(path):
            raise NotGGUF(f"{self.name} is not a GGUF model: its model blob {path} is not GGUF")
        return path

    def _why_no_model_layer(self) -> str:
        if self.config.get("remote_host") or self.config.get("remote_model"):
            return "it is an Ollama cloud model, which runs remotely and has no local weights"
        if self.layer("tensor") is not None:
            return "it is stored as safetensors tensors for Ollama's own engine, not as a GGUF blob"
        return "its manifest has no model layer"

    def text_layer(self, kind: str) -> str | None:
        """Contents of a small text layer (template, system, license), or None."""
        layer = self.layer(kind)
        if layer is None:
            return None
        path = blob_path(self.root, layer.digest)
        check_blob(path, layer)
        return path.read_text(encoding="utf-8", errors="replace")

    def params(self) -> dict[str, Any]:
        """Ollama's `params` layer (stop, temperature, num_ctx, ...) as a dict; {} if none."""
        text = self.text_layer("params")
        if not text:
            return {}
        try:
            params = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidManifest(f"{self.name}: its params layer is not valid JSON ({exc})") from exc
        return params if isinstance(params, dict) else {}


def find_store_root(models_dir: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> StoreRoot:
    """--models-dir > OLLAMA_MODELS > ~/.ollama/models > the Linux service store."""
    environ = os.environ if environ is None else environ
    if models_dir:
        return _checked_root(Path(models_dir).expanduser(), "--models-dir")
    if environ.get("OLLAMA_MODELS"):
        return _checked_root(Path(environ["OLLAMA_MODELS"]).expanduser(), "OLLAMA_MODELS")
    home = HOME_STORE.expanduser()
    for path, source in ((home, "~/.ollama/models"), (SERVICE_STORE, "the Ollama service store")):
        if _exists(path):
            return _checked_root(path, source)
    raise StoreNotFound(
        f"no Ollama model store found (looked in {home} and {SERVICE_STORE}); "
        "pull a model with 'ollama pull', or point --models-dir / OLLAMA_MODELS at your store"
    )


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except PermissionError:
        return True  # it is there, we just may not look; _checked_root says so


def _checked_root(path: Path, source: str) -> StoreRoot:
    try:
        if not path.is_dir():
            raise StoreNotFound(f"the model store {path} (from {source}) does not exist or is not a directory")
        if not (path / "manifests").exists() and (path / "models" / "manifests").is_dir():
            raise StoreNotFound(
                f"{path} (from {source}) is the folder above the model store; use {path / 'models'}"
            )
        os.listdir(path)
        manifests = path / "manifests"
        if manifests.exists():
            os.listdir(manifests)
    except PermissionError:
        raise StoreUnreadable(
            f"the model store {path} (from {source}) exists but is not readable by you; "
            "add yourself to group ollama (sudo usermod -aG ollama $USER, then log in again)"
        ) from None
    return StoreRoot(path=path, source=source)


def blob_path(root: Path, digest: str) -> Path:
    """`sha256:<64 hex>` -> `<root>/blobs/sha256-<hex>`; anything else is refused, never joined.

    Stores written by old Ollama versions that were never migrated name blobs `sha256:<hex>`;
    that name is used when only it exists.
    """
    match = _DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if not match:
        raise InvalidManifest(f"invalid layer digest {digest!r}: expected sha256:<64 hex digits>")
    path = root / "blobs" / f"sha256-{match.group(1)}"
    legacy = root / "blobs" / f"sha256:{match.group(1)}"
    return legacy if not path.exists() and legacy.exists() else path


def check_blob(path: Path, layer: Layer) -> None:
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        raise BlobError(f"blob {path} is missing (the store is incomplete; pull the model again)") from None
    except PermissionError:
        raise StoreUnreadable(f"blob {path} is not readable by you; add yourself to group ollama") from None
    if size != layer.size:
        raise BlobError(f"blob {path} has {size} bytes but the manifest says {layer.size} (incomplete download?)")


def verify_blob(path: Path, layer: Layer, progress=None) -> None:
    """Full sha256 check of one blob; `progress(n_bytes)` is called as it reads."""
    check_blob(path, layer)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            digest.update(chunk)
            if progress:
                progress(len(chunk))
    if f"sha256:{digest.hexdigest()}" != layer.digest:
        raise BlobError(f"blob {path} does not match its digest {layer.digest} (corrupt file; pull the model again)")


class Store:
    """The models under one store root."""

    def __init__(self, root: StoreRoot):
        self.root = root

    @property
    def path(self) -> Path:
        return self.root.path

    def resolve(self, name: str) -> StoredModel:
        """Name -> StoredModel, matching each path part case-insensitively as Ollama does."""
        ref = parse_model_name(name)
        manifest = self._find_manifest(ref)
        if manifest is None:
            raise ModelNotFound(self._not_found_message(name, ref))
        return self._load(ref, manifest)

    def models(self) -> Iterator[StoredModel | InvalidManifest]:
        """Every manifest in the store; unreadable ones come back as the error they raise."""
        manifests = self.path / "manifests"
        if not manifests.is_dir():
            return
        for path in sorted(manifests.glob("*/*/*/*")):
            if not path.is_file():
                continue
            ref = ModelRef(*path.relative_to(manifests).parts)
            try:
                yield self._load(ref, path)
            except InvalidManifest as exc:
                yield exc

    def _find_manifest(self, ref: ModelRef) -> Path | None:
        current = self.path / "manifests"
        for part in ref.manifest_parts:
            exact = current / part
            if exact.exists():
                current = exact
                continue
            if not current.is_dir():
                return None
            folded = [entry for entry in current.iterdir() if entry.name.lower() == part.lower()]
            if not folded:
                return None
            current = folded[0]
        return current if current.is_file() else None

    def _not_found_message(self, name: str, ref: ModelRef) -> str:
        known = [m.name for m in self.models() if isinstance(m, StoredModel)]
        close = difflib.get_close_matches(ref.display, known, n=3, cutoff=0.75)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; pull it with 'ollama pull {name}'"
        return f"model '{name}' not found in {self.path} (from {self.root.source}){hint}"

    def _load(self, ref: ModelRef, manifest_path: Path) -> StoredModel:
        try:
            doc = json.loads(manifest_path.read_text(encoding="utf-8"))
        except PermissionError:
            raise StoreUnreadable(
                f"manifest {manifest_path} is not readable by you; add yourself to group ollama"
            ) from None
        except (OSError, ValueError) as exc:
            raise InvalidManifest(f"manifest {manifest_path} is not valid JSON ({exc})") from None
        if not isinstance(doc, dict) or doc.get("schemaVersion") != 2 or not isinstance(doc.get("layers"), list):
            raise InvalidManifest(f"manifest {manifest_path} is not a schema 2 manifest with layers")
        layers = []
        for raw in doc["layers"]:
            if not isinstance(raw, dict) or not isinstance(raw.get("size"), int):
                raise InvalidManifest(f"manifest {manifest_path} has a malformed layer: {raw!r}")
            layer = Layer(str(raw.get("mediaType", "")), str(raw.get("digest", "")), raw["size"])
            blob_path(self.path, layer.digest)  # refuse bad digests up front
            layers.append(layer)
        return StoredModel(ref, manifest_path, self.path, self._config(doc.get("config")), tuple(layers))

    def _config(self, raw: Any) -> Mapping[str, Any]:
        # The config blob tells cloud models (remote_host) from local ones; it is optional.
        if not isinstance(raw, dict) or "digest" not in raw:
            return {}
        try:
            config = json.loads(blob_path(self.path, str(raw["digest"])).read_text(encoding="utf-8"))
        except (OSError, ValueError, InvalidManifest):
            return {}
        return config if isinstance(config, dict) else {}
