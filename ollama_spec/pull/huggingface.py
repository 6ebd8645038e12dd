"""From a Hugging Face GGUF repo: `hf.co/<user>/<repo>:<quant>` recorded in the store like any model.

huggingface-hub lists the repo (file names, sizes and LFS sha256s at one commit); the GGUF then
comes through the same resumable, verified blob download as the registry path, and the
manifest holds the model layer plus the `template`, `system` and `params` files the repo
provides (the files Ollama's own Hugging Face integration reads).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.utils import build_hf_headers

from ..errors import ModelNotFound, PullError
from ..gguf_info import read_model_info
from ..names import ModelRef
from ..store import MEDIA_TYPE_PREFIX
from .download import http_client, http_errors
from .fetcher import fetch_all
from .progress import PullEvent
from .settings import PullSettings
from .writer import Blob, StoreWriter

HF_HOSTS = ("hf.co", "huggingface.co", "www.huggingface.co")
DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_QUANT = "Q4_K_M"  # what Ollama picks for hf.co/<user>/<repo> without a tag
EXTRA_LAYERS = ("template", "system", "params")
MANIFEST_MEDIA_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_MEDIA_TYPE = "application/vnd.docker.container.image.v1+json"
_QUANT = re.compile(r"(?<![a-z0-9])(i?q\d(?:_[a-z0-9]+)*|bf16|f16|f32)(?=[-.]|$)", re.IGNORECASE)
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.IGNORECASE)


@dataclass(frozen=True)
class RepoFile:
    name: str
    size: int | None
    sha256: str | None  # LFS files only


def is_huggingface(ref: ModelRef) -> bool:
    return ref.host.lower() in HF_HOSTS


def hf_endpoint() -> str:
    """HF_ENDPOINT read at call time (huggingface-hub reads it once, at import)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def quant_of(filename: str) -> str | None:
    """`Llama-3.2-1B-Instruct-Q4_K_M.gguf` -> `Q4_K_M`."""
    found = _QUANT.findall(_SPLIT.sub(".gguf", filename.rsplit("/", 1)[-1]))
    return found[-1].upper() if found else None


def select_gguf(repo_id: str, files: list[RepoFile], tag: str) -> RepoFile:
    """The GGUF whose quant matches `tag` (case-insensitive; `latest` means Q4_K_M), or a clear error."""
    ggufs = [f for f in files if f.name.lower().endswith(".gguf") and "mmproj" not in f.name.lower()]
    if not ggufs:
        raise ModelNotFound(f"hf.co/{repo_id} has no GGUF files; ollama-spec can pull only GGUF repos")
    wanted = DEFAULT_QUANT if tag.lower() == "latest" else tag.upper()
    matches = sorted((f for f in ggufs if quant_of(f.name) == wanted), key=lambda f: (f.name.count("/"), f.name))
    if not matches and tag.lower() == "latest" and len({_SPLIT.sub("", f.name) for f in ggufs}) == 1:
        matches = ggufs
    if not matches:
        quants = sorted({quant_of(f.name) or f.name for f in ggufs})
        raise ModelNotFound(f"hf.co/{repo_id} has no {wanted} GGUF; it has: {', '.join(quants)}")
    chosen = matches[0]
    split = _SPLIT.search(chosen.name)
    if split:
        raise PullError(
            f"hf.co/{repo_id}:{wanted} is split into {int(split.group(2))} files ({chosen.name}); Ollama's store holds "
            "a model as one GGUF blob: merge the parts with llama-gguf-split --merge and import the result with "
            "'ollama create', or pick a quant that comes in one file"
        )
    if not chosen.sha256 or chosen.size is None:
        raise PullError(
            f"hf.co/{repo_id} gives no sha256 for {chosen.name} (not an LFS file), so it cannot be verified"
        )
    return chosen


def pull_from_huggingface(
    ref: ModelRef,
    writer: StoreWriter,
    settings: PullSettings,
    report: Callable[[PullEvent], None],
    cancel: threading.Event,
) -> None:
    """List the repo, download the matching GGUF (and template/system/params), write a manifest."""
    repo_id = f"{ref.namespace}/{ref.model}"
    endpoint = hf_endpoint()
    report(PullEvent(ref.display, "pulling manifest"))
    revision, files = _list_repo(repo_id, endpoint)
    gguf = select_gguf(repo_id, files, ref.tag)
    model = Blob(f"sha256:{gguf.sha256}", gguf.size)
    with http_client() as client:
        client.headers.update(build_hf_headers())  # a token, when the user has one (gated repos)
        extras = [
            (kind, _small_file(client, hf_hub_url(repo_id, kind, revision=revision, endpoint=endpoint), kind))
            for kind in EXTRA_LAYERS
            if any(f.name == kind for f in files)
        ]
        writer.check_free_space([model])
        url = hf_hub_url(repo_id, gguf.name, revision=revision, endpoint=endpoint)
        fetch_all(client, {model: url}, writer, settings, ref, report, cancel)
    layers = [_layer("model", model)] + [_layer(kind, writer.add_bytes(data)) for kind, data in extras]
    config = writer.add_bytes(json.dumps(_config(writer, model, gguf, layers)).encode())
    manifest = {
        "schemaVersion": 2,
        "mediaType": MANIFEST_MEDIA_TYPE,
        "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config.digest, "size": config.size},
        "layers": layers,
    }
    report(PullEvent(ref.display, "writing manifest"))
    writer.write_manifest(ref, json.dumps(manifest).encode())
    report(PullEvent(ref.display, "success"))


def _list_repo(repo_id: str, endpoint: str) -> tuple[str | None, list[RepoFile]]:
    try:
        info = HfApi(endpoint=endpoint).model_info(repo_id, files_metadata=True)
    except (RepositoryNotFoundError, RevisionNotFoundError):
        raise ModelNotFound(f"hf.co/{repo_id} not found on {endpoint} (no such repo, or it is private)") from None
    except HfHubHTTPError as exc:
        raise PullError(
            f"Hugging Face ({endpoint}) refused to list hf.co/{repo_id}: {str(exc).splitlines()[0]}"
        ) from None
    except httpx.HTTPError as exc:
        raise PullError(f"cannot reach Hugging Face at {endpoint} ({exc})") from None
    files = [
        RepoFile(s.rfilename, s.lfs.size if s.lfs else s.size, s.lfs.sha256 if s.lfs else None)
        for s in info.siblings or []
    ]
    return info.sha, files


def _small_file(client: httpx.Client, url: str, kind: str) -> bytes:
    with http_errors(url, "Hugging Face"):
        response = client.get(url)
    if response.status_code >= 400:
        raise PullError(f"{url} answered HTTP {response.status_code}")
    if kind == "params":
        try:
            json.loads(response.content)
        except ValueError:
            raise PullError(f"the repo's params file ({url}) is not JSON, which Ollama needs") from None
    return response.content


def _layer(kind: str, blob: Blob) -> dict:
    return {"mediaType": MEDIA_TYPE_PREFIX + kind, "digest": blob.digest, "size": blob.size}


def _config(writer: StoreWriter, model: Blob, gguf: RepoFile, layers: list[dict]) -> dict:
    info = read_model_info(writer.blob_path(model), read_vocab=False)
    return {
        "model_format": "gguf",
        "model_family": info.architecture,
        "model_families": [info.architecture],
        "model_type": info.parameter_label,
        "file_type": quant_of(gguf.name) or info.file_type,
        "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
    }
