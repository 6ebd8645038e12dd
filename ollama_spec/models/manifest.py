"""One manifest file read into its layers: `{"layers": [{"mediaType", "digest", "size"}, ...], "config": ...}`.

Ollama decodes a manifest without checking schemaVersion; every layer is checked here before
its digest can become a blob path. Nothing here opens a blob: store.py does.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ollama_spec.errors import InvalidManifest, ModelNotFound, StoreUnreadable
from ollama_spec.models.gguf_header import shown
from ollama_spec.models.gguf_info import format_bytes

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
# Ollama's BlobsPath takes `sha256:<hex>` and `sha256-<hex>` alike (the blob's own file name). Upper-case hex
# matches its regex too, but the blob would then need an upper-case file name: refused here.
DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")
# Ollama's manifests and config blobs are a few KB. Anything far larger is not one, and is never read whole.
MAX_MANIFEST_BYTES = 1 << 20


@dataclass(frozen=True)
class Layer:
    media_type: str
    digest: str
    size: int

    @property
    def kind(self) -> str:
        """`model`, `template`, ... for Ollama's own media types, else the full media type."""
        return self.media_type.removeprefix(MEDIA_TYPE_PREFIX)


def read_manifest(name: str, path: Path) -> tuple[tuple[Layer, ...], Layer | None, str]:
    """The layers of model `name`'s manifest at `path`, its config blob's entry (None: none valid) and the
    sha256 of the bytes read, as Ollama's digest of the manifest."""

    def invalid(what: str) -> InvalidManifest:
        return InvalidManifest(f"{name}: its manifest {path} {what}")

    try:
        data = read_small(path)
        doc = json.loads(data)
    except FileNotFoundError:  # deleted since its path was found
        raise ModelNotFound(f"model '{name}' not found: its manifest {path} was deleted") from None
    except PermissionError:
        raise StoreUnreadable(
            f"{name}: its manifest {path} is not readable by you; add yourself to group ollama"
        ) from None
    except TooLarge:
        raise invalid(f"is larger than {format_bytes(MAX_MANIFEST_BYTES)}; a manifest is a few KB") from None
    except OSError as exc:
        raise invalid(f"cannot be read ({exc.strerror or exc})") from None
    except (ValueError, RecursionError) as exc:
        raise invalid(f"is not valid JSON ({brief(exc)})") from None
    # Ollama decodes a manifest without checking schemaVersion, and reads no layers as none.
    if not isinstance(doc, dict) or not isinstance(doc.get("layers", []), list):
        raise invalid("is not a manifest with a list of layers")
    layers = []
    for number, raw in enumerate(doc.get("layers") or [], 1):
        if not isinstance(raw, dict):
            raise invalid(f"has a layer {number} that is not an object")
        media_type, digest, size = raw.get("mediaType"), raw.get("digest"), raw.get("size")
        if not isinstance(media_type, str):
            raise invalid(f"has a layer {number} without a media type")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 1 << 63:
            raise invalid(f"has a layer {number} whose size {shown(size)} is not a byte count")
        if not isinstance(digest, str) or not (match := DIGEST.fullmatch(digest)):  # never becomes a path
            raise invalid(f"has an invalid layer digest {shown(digest)}: expected sha256:<64 hex digits>")
        layers.append(Layer(media_type, f"sha256:{match.group(1)}", size))
    return tuple(layers), _config_layer(doc.get("config")), hashlib.sha256(data).hexdigest()


def _config_layer(raw: Any) -> Layer | None:
    """The manifest's config entry as a Layer, or None when it names no valid blob."""
    if not isinstance(raw, dict) or not isinstance(raw.get("digest"), str):
        return None
    match = DIGEST.fullmatch(raw["digest"])
    size = raw.get("size")
    if not match or not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 1 << 63:
        return None
    return Layer(str(raw.get("mediaType") or "config"), f"sha256:{match.group(1)}", size)


def brief(exc: Exception) -> str:
    """A JSON error in a few words (a nesting bomb says so, not its traceback)."""
    return "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:200]


class TooLarge(Exception):
    pass


def read_small(path: Path, limit: int = MAX_MANIFEST_BYTES) -> bytes:
    """The whole file if it holds at most `limit` bytes (read no further: it may be a device)."""
    with open(path, "rb") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise TooLarge
    return data
