"""Straight from an Ollama (Docker v2) registry: manifest, then blobs, in Ollama's own layout."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path

import httpx

from ollama_spec.errors import InvalidManifest, ModelNotFound, PullError
from ollama_spec.models.names import ModelRef
from ollama_spec.models.store import blob_path
from ollama_spec.pull.download import http_client, http_errors, short_text
from ollama_spec.pull.fetcher import fetch_and_write
from ollama_spec.pull.huggingface import is_huggingface
from ollama_spec.pull.progress import PullEvent
from ollama_spec.pull.settings import PullSettings
from ollama_spec.pull.writer import Blob, StoreWriter

MANIFEST_ACCEPT = "application/vnd.docker.distribution.manifest.v2+json"


def registry_base(ref: ModelRef, insecure: bool) -> str:
    return f"{'http' if insecure else 'https'}://{ref.host}"


def pull_from_registry(
    ref: ModelRef,
    writer: StoreWriter,
    settings: PullSettings,
    report: Callable[[PullEvent], None],
    cancel: threading.Event,
) -> None:
    """Fetch `ref`'s manifest, download and verify every blob it names, then write the manifest."""
    base = registry_base(ref, settings.insecure)
    repo = f"{base}/v2/{ref.namespace}/{ref.model}"
    report(PullEvent(ref.display, "pulling manifest"))
    with http_client() as client:
        data = _get_manifest(client, ref, f"{repo}/manifests/{ref.tag}")
        blobs = manifest_blobs(data, f"{repo}/manifests/{ref.tag}", writer.path)
        writer.check_free_space(blobs)
        urls = {blob: f"{repo}/blobs/{blob.digest}" for blob in blobs}
        fetch_and_write(client, urls, writer, settings, ref, report, cancel, lambda _: data)
    report(PullEvent(ref.display, "success"))


def _get_manifest(client: httpx.Client, ref: ModelRef, url: str) -> bytes:
    with http_errors(url):
        response = client.get(url, headers={"Accept": MANIFEST_ACCEPT})
    if response.status_code == 404:
        raise ModelNotFound(
            f"model '{ref.display}' not found at {registry_base(ref, url.startswith('http:'))} "
            "(no such model or tag: HTTP 404)"
        )
    if response.status_code in (401, 403):
        hub = (
            " or, for a gated or private Hugging Face repo, with your Hugging Face token (--via hf)"
            if (is_huggingface(ref))
            else ""
        )
        raise PullError(
            f"{url} refuses access (HTTP {response.status_code}); for private models pull through "
            f"the Ollama daemon (ollama-spec pull --via ollama){hub}"
        )
    if response.status_code >= 400:
        raise PullError(f"{url} answered HTTP {response.status_code}: {short_text(response.text)}")
    return response.content


def manifest_blobs(data: bytes, source: str, root: Path) -> list[Blob]:
    """The layers and config of a registry manifest, each checked: `sha256:<64 hex>` and a size."""
    try:
        doc = json.loads(data)
    except ValueError:
        raise InvalidManifest(f"the manifest from {source} is not JSON") from None
    if not isinstance(doc, dict) or doc.get("schemaVersion") != 2 or not isinstance(doc.get("layers"), list):
        raise InvalidManifest(f"the manifest from {source} is not a schema 2 manifest with layers")
    entries = list(doc["layers"]) + ([doc["config"]] if isinstance(doc.get("config"), dict) else [])
    blobs: dict[str, Blob] = {}
    for entry in entries:
        if not isinstance(entry, dict):
            raise InvalidManifest(f"the manifest from {source} has a malformed layer: {entry!r}")
        digest, size = entry.get("digest"), entry.get("size")
        try:
            blob_path(root, digest)  # refuses anything but sha256:<64 hex>
        except InvalidManifest as exc:
            raise InvalidManifest(f"the manifest from {source} has an {exc}") from None
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidManifest(f"the manifest from {source} gives layer {digest} the invalid size {size!r}")
        if digest in blobs and blobs[digest].size != size:
            raise InvalidManifest(f"the manifest from {source} gives {digest} two different sizes")
        blobs[digest] = Blob(digest, size)
    return list(blobs.values())
