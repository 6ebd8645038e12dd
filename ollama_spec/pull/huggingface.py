"""Through the Hugging Face Hub's API: `hf.co/<user>/<repo>:<quant>` recorded in the store like any model.

`ollama pull hf.co/...` (and ours, by default) talks to hf.co's Ollama registry, which builds the
manifest itself, chat template included. This path is for what that cannot do: a Hub mirror
(HF_ENDPOINT) and gated or private repos read with the user's Hugging Face token (`--via hf`).
huggingface-hub lists the repo (file names, sizes and LFS sha256s at one commit); the GGUF (and a
vision repo's projector) then comes through the same resumable, verified blob download as the
registry path, and the manifest holds those plus the `template`, `system` and `params` files the
repo provides. A repo rarely has an Ollama `template` file: ollama-spec reads the GGUF's own chat
template, but Ollama without one sends prompts unformatted, so the pull says so.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
from huggingface_hub import HfApi, hf_hub_url
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError
from huggingface_hub.utils import build_hf_headers

from ollama_spec.errors import ModelNotFound, OllamaSpecError, PullError, one_line
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.models.manifest import MEDIA_TYPE_PREFIX
from ollama_spec.models.names import ModelRef
from ollama_spec.pull.download import http_client, http_errors
from ollama_spec.pull.fetcher import fetch_and_write
from ollama_spec.pull.progress import PullEvent
from ollama_spec.pull.settings import PullSettings
from ollama_spec.pull.writer import Blob, StoreWriter

HF_HOSTS = ("hf.co", "huggingface.co", "www.huggingface.co")
DEFAULT_ENDPOINT = "https://huggingface.co"
DEFAULT_QUANT = "Q4_K_M"  # what Ollama picks for hf.co/<user>/<repo> without a tag
# Without a tag and without Q4_K_M, Hugging Face's Ollama integration picks "one reasonable quant type
# present inside the repo": the usual 4-bit ones first, then bigger, then smaller.
REASONABLE_QUANTS = (
    DEFAULT_QUANT,
    "Q4_K_S",
    "IQ4_XS",
    "IQ4_NL",
    "Q4_0",
    "Q4_1",
    "Q5_K_M",
    "Q5_K_S",
    "Q5_0",
    "Q5_1",
    "Q6_K",
    "Q8_0",
    "Q3_K_L",
    "Q3_K_M",
    "IQ3_M",
    "Q3_K_S",
    "BF16",
    "F16",
    "Q2_K",
    "F32",
)
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


def endpoint_overridden() -> bool:
    """HF_ENDPOINT names a mirror: it speaks the Hub's API, not hf.co's Ollama registry protocol."""
    return bool(os.environ.get("HF_ENDPOINT"))


def hf_endpoint() -> str:
    """HF_ENDPOINT read at call time (huggingface-hub reads it once, at import)."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def quant_of(filename: str) -> str | None:
    """`Llama-3.2-1B-Instruct-Q4_K_M.gguf` -> `Q4_K_M`."""
    found = _QUANT.findall(_SPLIT.sub(".gguf", filename.rsplit("/", 1)[-1]))
    return found[-1].upper() if found else None


def select_gguf(repo_id: str, files: list[RepoFile], tag: str) -> RepoFile:
    """The GGUF that `tag` names, as Hugging Face's Ollama integration reads it: a quant (case-insensitive),
    or a file's full name; `latest` is Q4_K_M, else the first quant of REASONABLE_QUANTS the repo has.
    A plain `<model>-<QUANT>.gguf` wins over variants of the same quant (`-imat`, `-UD`)."""
    ggufs = [f for f in files if f.name.lower().endswith(".gguf") and "mmproj" not in f.name.lower()]
    if not ggufs:
        raise ModelNotFound(f"hf.co/{repo_id} has no GGUF files; ollama-spec can pull only GGUF repos")
    wanted = tag.upper()
    matches = [f for f in ggufs if f.name.rsplit("/", 1)[-1].lower() == tag.lower()]
    if not matches and tag.lower() == "latest":
        wanted = next((q for q in REASONABLE_QUANTS if any(quant_of(f.name) == q for f in ggufs)), DEFAULT_QUANT)
        if len({_SPLIT.sub("", f.name) for f in ggufs}) == 1 and not any(quant_of(f.name) == wanted for f in ggufs):
            matches = ggufs  # one model, its quant not in the name
    if not matches:
        matches = [f for f in ggufs if quant_of(f.name) == wanted]
    if not matches:
        quants = sorted({quant_of(f.name) or f.name for f in ggufs})
        raise ModelNotFound(f"hf.co/{repo_id} has no {wanted} GGUF; it has: {', '.join(quants)}")
    chosen = min(matches, key=lambda f: (f.name.count("/"), not _plain(f.name, wanted), f.name))
    split = _SPLIT.search(chosen.name)
    if split:
        raise PullError(
            f"hf.co/{repo_id}:{wanted} is split into {int(split.group(2))} files ({chosen.name}); Ollama's store holds "
            "a model as one GGUF blob: merge the parts with llama-gguf-split --merge and import the result with "
            "'ollama create', or pick a quant that comes in one file"
        )
    _require_digest(repo_id, chosen)
    return chosen


def select_projector(files: list[RepoFile]) -> RepoFile | None:
    """A vision repo's projector (`mmproj-*.gguf`), which Ollama keeps as the model's projector layer:
    F16 when there are several (what Hugging Face's Ollama integration serves), else the first."""
    projectors = sorted(
        (f for f in files if f.name.lower().endswith(".gguf") and "mmproj" in f.name.lower()),
        key=lambda f: (quant_of(f.name) != "F16", f.name),
    )
    return projectors[0] if projectors else None


def _plain(filename: str, quant: str) -> bool:
    """`Model-Q4_K_M.gguf` (or `.Q4_K_M.gguf`), not a variant such as `Model-Q4_K_M-imat.gguf`."""
    stem = _SPLIT.sub(".gguf", filename.rsplit("/", 1)[-1]).lower()
    return stem.endswith((f"-{quant.lower()}.gguf", f".{quant.lower()}.gguf", f"_{quant.lower()}.gguf"))


def _require_digest(repo_id: str, file: RepoFile) -> None:
    if not file.sha256 or file.size is None:
        raise PullError(f"hf.co/{repo_id} gives no sha256 for {file.name} (not an LFS file), so it cannot be verified")


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
    revision, files = list_repo(repo_id, endpoint)
    gguf = select_gguf(repo_id, files, ref.tag)
    model = Blob(f"sha256:{gguf.sha256}", gguf.size)
    projector_file = select_projector(files)
    if projector_file is not None:
        _require_digest(repo_id, projector_file)
    projector = Blob(f"sha256:{projector_file.sha256}", projector_file.size) if projector_file else None
    with http_client() as client:
        client.headers.update(build_hf_headers())  # a token, when the user has one (gated repos)
        extras = [
            (kind, small_file(client, hf_hub_url(repo_id, kind, revision=revision, endpoint=endpoint), kind))
            for kind in EXTRA_LAYERS
            if any(f.name == kind for f in files)
        ]
        urls = {model: hf_hub_url(repo_id, gguf.name, revision=revision, endpoint=endpoint)}
        if projector is not None:
            urls[projector] = hf_hub_url(repo_id, projector_file.name, revision=revision, endpoint=endpoint)
        writer.check_free_space(urls)

        manifest = _manifest_of(repo_id, gguf, model, projector, extras, writer)
        fetch_and_write(client, urls, writer, settings, ref, report, cancel, manifest)
    if not any(kind == "template" for kind, _ in extras):
        report(
            PullEvent(
                ref.display,
                "note: the repo has no Ollama template layer: ollama-spec reads the GGUF's "
                "chat template, but Ollama would send prompts unformatted",
            )
        )
    report(PullEvent(ref.display, "success"))


def _manifest_of(
    repo_id: str,
    gguf: RepoFile,
    model: Blob,
    projector: Blob | None,
    extras: list[tuple[str, bytes]],
    writer: StoreWriter,
) -> Callable[[Mapping[Blob, Path | None]], bytes]:
    """What writes the pull's manifest once its blobs are verified: its layers, and a config read from
    the downloaded GGUF."""

    def manifest(downloads: Mapping[Blob, Path | None]) -> bytes:
        layers = [
            _layer("model", model),
            *([_layer("projector", projector)] if projector else []),
            *(_layer(kind, writer.add_bytes(data)) for kind, data in extras),
        ]
        gguf_path = downloads.get(model) or writer.blob_path(model)
        try:
            config = writer.add_bytes(json.dumps(_config(gguf_path, model, gguf, layers)).encode())
        except OllamaSpecError as exc:  # its sha256 matched, but it is no GGUF that llama.cpp could read
            raise PullError(
                f"hf.co/{repo_id}: {gguf.name} is not a readable GGUF ({one_line(str(exc))}); no manifest was written"
            ) from None
        doc = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": config.digest, "size": config.size},
            "layers": layers,
        }
        return json.dumps(doc).encode()

    return manifest


def list_repo(repo_id: str, endpoint: str) -> tuple[str | None, list[RepoFile]]:
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


def small_file(client: httpx.Client, url: str, kind: str) -> bytes:
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


def _config(gguf_path: Path, model: Blob, gguf: RepoFile, layers: list[dict]) -> dict:
    info = read_model_info(gguf_path, read_vocab=False)
    return {
        "model_format": "gguf",
        "model_family": info.architecture,
        "model_families": [info.architecture],
        "model_type": info.parameter_label,
        "file_type": quant_of(gguf.name) or info.file_type,
        "rootfs": {"type": "layers", "diff_ids": [layer["digest"] for layer in layers]},
    }
