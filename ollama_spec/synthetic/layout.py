"""Write models into a directory laid out exactly like Ollama's store."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from ollama_spec.models.manifest import MEDIA_TYPE_PREFIX
from ollama_spec.models.names import parse_model_name

MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA_TYPE = "application/vnd.docker.container.image.v1+json"

# What `ollama show --modelfile llama3.1` carries, trimmed: a Go template, stop tokens, a license.
LLAMA3_GO_TEMPLATE = (
    "{{ if .System }}<|start_header_id|>system<|end_header_id|>\n\n{{ .System }}<|eot_id|>{{ end }}"
    "{{ if .Prompt }}<|start_header_id|>user<|end_header_id|>\n\n{{ .Prompt }}<|eot_id|>{{ end }}"
    "<|start_header_id|>assistant<|end_header_id|>\n\n{{ .Response }}<|eot_id|>"
)
DEFAULT_PARAMS = {"stop": ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]}
LICENSE = "Synthetic weights made by ollama-spec for tests and demos. Public domain."


def add_blob(root: Path, source: Path | bytes) -> tuple[str, int]:
    """Copy bytes or move a finished file into `blobs/` under its sha256 name; return digest, size.

    Files are staged outside `blobs/` (Ollama deletes odd names there when it starts) and moved
    in with one atomic rename.
    """
    blobs = root / "blobs"
    blobs.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    if isinstance(source, bytes):
        digest.update(source)
        fd, staged = tempfile.mkstemp(dir=root, prefix=".staging-")
        with os.fdopen(fd, "wb") as f:
            f.write(source)
        os.chmod(staged, 0o644)  # mkstemp makes 0600; Ollama's blobs are world-readable
        source = Path(staged)
    else:
        with open(source, "rb") as f:
            while chunk := f.read(8 << 20):
                digest.update(chunk)
    size = source.stat().st_size
    target = blobs / f"sha256-{digest.hexdigest()}"
    if target.exists():
        source.unlink()
    else:
        os.replace(source, target)
    return f"sha256:{digest.hexdigest()}", size


def write_model(
    root: Path,
    name: str,
    gguf_file: Path,
    *,
    params: dict | None = None,
    template: str | None = LLAMA3_GO_TEMPLATE,
    system: str | None = None,
) -> Path:
    """Add a GGUF (moved into blobs/) plus template/params/license layers; return the manifest."""
    ref = parse_model_name(name)
    layers = [_layer("model", *add_blob(root, gguf_file))]
    extras = [("template", template), ("system", system), ("license", LICENSE)]
    extras.append(("params", json.dumps(params if params is not None else DEFAULT_PARAMS)))
    for kind, text in extras:
        if text is not None:
            layers.append(_layer(kind, *add_blob(root, text.encode("utf-8"))))
    config = {
        "model_format": "gguf",
        "model_family": "llama",
        "model_families": ["llama"],
        "model_type": "synthetic",
        "file_type": "synthetic",
        "architecture": "amd64",
        "os": "linux",
        "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
    }
    config_digest, config_size = add_blob(root, json.dumps(config).encode("utf-8"))
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config_digest, "size": config_size},
        "layers": layers,
    }
    path = root / "manifests" / Path(*ref.manifest_parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest), encoding="utf-8")
    return path


def _layer(kind: str, digest: str, size: int) -> dict:
    return {"mediaType": MEDIA_TYPE_PREFIX + kind, "digest": digest, "size": size}
