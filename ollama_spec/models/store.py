"""Read-only access to Ollama's model store: its root, a name's manifest (read by manifest.py), the
layers' blobs.

Layout (from Ollama's source): `<root>/manifests/<host>/<namespace>/<model>/<tag>` holds a JSON
manifest whose layers point at `<root>/blobs/sha256-<hex>`. Nothing here ever writes.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ollama_spec.config import ollama_var
from ollama_spec.errors import (
    BlobError,
    CorruptGGUF,
    InvalidManifest,
    ModelNotFound,
    NotGGUF,
    OllamaSpecError,
    StoreNotFound,
    StoreUnreadable,
)
from ollama_spec.models.blobs import check_blob
from ollama_spec.models.gguf_header import shown
from ollama_spec.models.gguf_info import ModelInfo, format_bytes, is_gguf, read_model_info
from ollama_spec.models.manifest import DIGEST, Layer, TooLarge, brief, read_manifest, read_small
from ollama_spec.models.names import ModelRef, is_valid_ref, parse_model_name

HOME_STORE = Path("~/.ollama/models")
SERVICE_STORE = Path("/usr/share/ollama/.ollama/models")
# Ollama's text layers (template, system, license, params) are tens of KB; anything far larger is not one.
MAX_TEXT_LAYER_BYTES = 16 << 20
# Ollama's params layer decodes into api.Options: each key has one JSON type.
_NUMBER_PARAMS = (
    "temperature",
    "top_p",
    "min_p",
    "typical_p",
    "repeat_penalty",
    "presence_penalty",
    "frequency_penalty",
    "tfs_z",
    "mirostat_tau",
    "mirostat_eta",
)
_INTEGER_PARAMS = (
    "top_k",
    "seed",
    "num_predict",
    "num_ctx",
    "num_batch",
    "num_keep",
    "repeat_last_n",
    "mirostat",
    "num_gpu",
    "num_thread",
    "draft_num_predict",
)


@dataclass(frozen=True)
class StoreRoot:
    path: Path
    source: str  # where the path came from, for messages: "--models-dir", "OLLAMA_MODELS", ...


@dataclass(frozen=True)
class StoredModel:
    """One manifest in the store, with its layers; `gguf_path` is the model blob."""

    ref: ModelRef
    manifest_path: Path
    root: Path
    config: Mapping[str, Any]
    layers: tuple[Layer, ...]
    config_layer: Layer | None = None  # the manifest's config blob (cloud models say so there)
    digest: str = ""  # the sha256 of the manifest's bytes as read: a copy or a pull over the name changes it

    @property
    def name(self) -> str:
        return self.ref.display

    def layer(self, kind: str) -> Layer | None:
        """The layer of this kind; of several, the last, as Ollama's GetModel assigns them in order."""
        return next((layer for layer in reversed(self.layers) if layer.kind == kind), None)

    def config_problem(self) -> str | None:
        """Why Ollama could not open the config blob (missing, wrong size, unreadable), or None."""
        if self.config_layer is None:
            return None
        try:
            check_blob(blob_path(self.root, self.config_layer.digest), self.config_layer)
        except OllamaSpecError as exc:
            return f"config {exc}"
        return None

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
        try:
            gguf = is_gguf(path)
        except PermissionError:
            raise StoreUnreadable(f"blob {path} is not readable by you; add yourself to group ollama") from None
        except OSError as exc:
            raise BlobError(f"blob {path} cannot be read ({exc.strerror or exc})") from None
        if not gguf:
            raise NotGGUF(f"{self.name} is not a GGUF model: its model blob {path} is not GGUF")
        return path

    def model_info(self, *, read_vocab: bool = True) -> ModelInfo:
        """The model blob's GGUF header; errors name the model first."""
        path = self.gguf_path
        try:
            return read_model_info(path, read_vocab=read_vocab)
        except (CorruptGGUF, NotGGUF) as exc:
            raise type(exc)(f"{self.name}: {exc}") from None

    def _why_no_model_layer(self) -> str:
        if self.config.get("remote_host") or self.config.get("remote_model"):
            return "it is an Ollama cloud model, which runs remotely and has no local weights"
        if self.layer("tensor") is not None:
            return "it is stored as safetensors tensors for Ollama's own engine, not as a GGUF blob"
        return "its manifest has no model layer"

    def text_layer(self, kind: str) -> str | None:
        """Contents of a small text layer (template, system, license), or None."""
        layer = self.layer(kind)
        return None if layer is None else self.layer_text(layer)

    def layer_text(self, layer: Layer) -> str:
        """Contents of one small text layer (of several license layers, say)."""
        kind = layer.kind
        if layer.size > MAX_TEXT_LAYER_BYTES:
            raise InvalidManifest(
                f"{self.name}: its {shown(kind)} layer is {format_bytes(layer.size)}, far more than a {kind} holds"
            )
        path = blob_path(self.root, layer.digest)
        check_blob(path, layer)
        try:
            return path.read_bytes().decode("utf-8", errors="replace")
        except OSError as exc:
            raise BlobError(f"blob {path} cannot be read ({exc.strerror or exc})") from None

    def params(self) -> dict[str, Any]:
        """Ollama's `params` layer (stop, temperature, num_ctx, ...) as a dict; {} if none."""
        text = self.text_layer("params")
        if not text:
            return {}
        try:
            params = json.loads(text)
        except (ValueError, RecursionError) as exc:
            raise InvalidManifest(f"{self.name}: its params layer is not valid JSON ({brief(exc)})") from None
        if not isinstance(params, dict):
            raise InvalidManifest(f"{self.name}: its params layer is not a JSON object")
        for key, value in params.items():
            if problem := _param_problem(key, value):
                raise InvalidManifest(f"{self.name}: its params layer has {key} {shown(value)}: {problem}")
        return params


def find_store_root(models_dir: str | os.PathLike | None = None, environ: Mapping[str, str] | None = None) -> StoreRoot:
    """--models-dir > OLLAMA_MODELS > ~/.ollama/models > the Linux service store."""
    environ = os.environ if environ is None else environ
    if models_dir:
        return _checked_root(Path(models_dir).expanduser(), "--models-dir")
    if ollama_var("OLLAMA_MODELS", environ):
        return _checked_root(Path(ollama_var("OLLAMA_MODELS", environ)).expanduser(), "OLLAMA_MODELS")
    home = HOME_STORE.expanduser()
    for path, source in ((home, "~/.ollama/models"), (SERVICE_STORE, "the Ollama service store")):
        if _exists(path):
            return _checked_root(path, source)
    raise StoreNotFound(
        f"no Ollama model store found (looked in {home} and {SERVICE_STORE}); "
        "pull a model with 'ollama-spec pull' (or 'ollama pull'), or point --models-dir / OLLAMA_MODELS at your store"
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
            raise StoreNotFound(f"{path} (from {source}) is the folder above the model store; use {path / 'models'}")
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


def unreadable(path: Path) -> StoreUnreadable:
    """The error for a folder or file inside the store that this user may not read."""
    return StoreUnreadable(
        f"{path} is not readable by you; add yourself to group ollama "
        "(sudo usermod -aG ollama $USER, then log in again)"
    )


def blob_path(root: Path, digest: Any) -> Path:
    """`sha256:<64 hex>` (or `sha256-<hex>`) -> `<root>/blobs/sha256-<hex>`; anything else is refused, never joined.

    Stores written by old Ollama versions that were never migrated name blobs `sha256:<hex>`;
    that name is used when only it exists.
    """
    match = DIGEST.fullmatch(digest) if isinstance(digest, str) else None
    if not match:
        raise InvalidManifest(f"invalid layer digest {shown(digest)}: expected sha256:<64 hex digits>")
    path = root / "blobs" / f"sha256-{match.group(1)}"
    legacy = root / "blobs" / f"sha256:{match.group(1)}"
    try:
        return legacy if not path.exists() and legacy.exists() else path
    except PermissionError:  # Python 3.11's exists() raises it for a folder it may not search
        raise unreadable(root / "blobs") from None


def _param_problem(key: str, value: Any) -> str | None:
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) < 2**63
    if key in _NUMBER_PARAMS and not number:
        return "expected a number"
    if key in _INTEGER_PARAMS and not (number and (isinstance(value, int) or value.is_integer())):
        return "expected a whole number"
    if key == "stop" and not (isinstance(value, list) and all(isinstance(s, str) for s in value)):
        return "expected a list of strings"
    return None


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
        # the stored spelling, as Ollama's getExistingName: `TINY-TARGET` is shown as tiny-target:latest
        try:
            return self._load(ModelRef(*manifest.relative_to(self.path / "manifests").parts), manifest)
        except ModelNotFound:  # deleted since it was found
            raise ModelNotFound(self._not_found_message(name, ref)) from None

    def models(self) -> Iterator[StoredModel | BrokenModel]:
        """Every manifest in the store; one that cannot be read comes back as a BrokenModel.

        As in Ollama's manifest listing, a path that is not a valid name (`.DS_Store`, `bad name`,
        `-partial`) is no model; nor is an editor's or a writer's `*.tmp` file. A folder that
        cannot be read is an error, not an empty store. A model deleted while the store is listed is
        left out.
        """
        for path in sorted(self._manifest_paths()):
            parts = path.relative_to(self.path / "manifests").parts
            if not is_valid_ref(parts) or parts[-1].lower().endswith(".tmp"):
                continue
            ref = ModelRef(*parts)
            try:
                yield self._load(ref, path)
            except ModelNotFound:
                continue
            except OllamaSpecError as exc:
                yield BrokenModel(ref, path, exc)

    def _manifest_paths(self) -> list[Path]:
        """manifests/*/*/*/* that are files; glob would pass over an unreadable folder in silence."""
        level = [self.path / "manifests"]
        if not _is(level[0], Path.is_dir, level[0].parent):
            return []
        for depth in range(4):
            wanted = Path.is_dir if depth < 3 else Path.is_file
            level = [entry for folder in level for entry in _entries(folder) if _is(entry, wanted, folder)]
        return level

    def _find_manifest(self, ref: ModelRef) -> Path | None:
        current = self.path / "manifests"
        try:
            for part in ref.manifest_parts:
                exact = current / part
                if exact.exists():
                    current = exact
                    continue
                if not current.is_dir():
                    return None
                folded = [entry for entry in _entries(current) if entry.name.lower() == part.lower()]
                if not folded:
                    return None
                current = folded[0]
            return current if current.is_file() else None
        except PermissionError:  # exists() too raises it (Python 3.11) when `current` may not be searched
            raise unreadable(current) from None

    def _not_found_message(self, name: str, ref: ModelRef) -> str:
        known = [m.name for m in self.models() if isinstance(m, StoredModel)]
        close = difflib.get_close_matches(ref.display, known, n=3, cutoff=0.75)
        hint = f"; did you mean {', '.join(close)}?" if close else f"; pull it with 'ollama-spec pull {name}'"
        return f"model '{name}' not found in {self.path} (from {self.root.source}){hint}"

    def _load(self, ref: ModelRef, manifest_path: Path) -> StoredModel:
        layers, config_layer, digest = read_manifest(ref.display, manifest_path)
        return StoredModel(ref, manifest_path, self.path, self._config(config_layer), layers, config_layer, digest)

    def _config(self, layer: Layer | None) -> Mapping[str, Any]:
        # The config blob tells cloud models (remote_host) from local ones; a missing one is
        # reported by `show` (StoredModel.config_problem), not here.
        if layer is None:
            return {}
        try:
            config = json.loads(read_small(blob_path(self.path, layer.digest)))
        except (OSError, ValueError, RecursionError, OllamaSpecError, TooLarge):
            return {}
        return config if isinstance(config, dict) else {}


def _entries(folder: Path) -> list[Path]:
    """What `folder` holds; nothing when a delete removed it since it was found (a model's folder goes
    with its last tag)."""
    try:
        return list(folder.iterdir())
    except PermissionError:
        raise unreadable(folder) from None
    except (FileNotFoundError, NotADirectoryError):
        return []


def _is(path: Path, test, folder: Path) -> bool:
    """`test(path)`; a PermissionError (Python 3.11 raises it) names `folder`, the one that may not be searched."""
    try:
        return test(path)
    except PermissionError:
        raise unreadable(folder) from None


@dataclass(frozen=True)
class BrokenModel:
    """A manifest that could not be read: its name (from its path) and why."""

    ref: ModelRef
    manifest_path: Path
    error: OllamaSpecError

    @property
    def name(self) -> str:
        return self.ref.display
