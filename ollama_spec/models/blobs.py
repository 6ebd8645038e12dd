"""A blob of the store checked against its manifest layer: present, a regular file of the right size,
and (when asked) its sha256."""

from __future__ import annotations

import hashlib
import stat
from pathlib import Path

from ollama_spec.errors import BlobError, StoreUnreadable
from ollama_spec.models.manifest import DIGEST, Layer

_HASH_CHUNK = 8 << 20


def check_blob(path: Path, layer: Layer) -> None:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise BlobError(f"blob {path} is missing (the store is incomplete; pull the model again)") from None
    except PermissionError:
        raise StoreUnreadable(f"blob {path} is not readable by you; add yourself to group ollama") from None
    except OSError as exc:
        raise BlobError(f"blob {path} cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        raise BlobError(f"blob {path} is not a regular file")
    size = info.st_size
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
    if digest.hexdigest() != DIGEST.fullmatch(layer.digest).group(1):
        raise BlobError(f"blob {path} does not match its digest {layer.digest} (corrupt file; pull the model again)")
