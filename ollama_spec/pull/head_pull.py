"""`pull <head> --head-for <target>`: an EAGLE-3 head checkpoint from the Hub or a folder, into the store as a GGUF.

From the Hub, huggingface-hub lists the repo; config.json and the weights (`*.safetensors`, else
`pytorch_model*.bin`) come through the same resumable, sha256-verified download as any blob, but stay in the
store's partial folder: they are not Ollama blobs and no manifest names them. The checkpoint is converted
(pull/head_convert) against the target in the same store, checked by the rules `pair` applies
(models/compat, models/heads) and by `verify` (the CLI has llama.cpp load it), and only then enters `blobs/`
with a manifest like any pulled model. The downloads are removed once the head is stored; an interrupted pull
keeps them and resumes.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from huggingface_hub import hf_hub_url
from huggingface_hub.utils import build_hf_headers

from ollama_spec.errors import OllamaSpecError, PullError, one_line
from ollama_spec.models.architectures import has_recurrent_state
from ollama_spec.models.compat import check_compatibility
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.models.heads import is_head
from ollama_spec.models.manifest import MEDIA_TYPE_PREFIX
from ollama_spec.models.names import ModelRef, parse_model_name
from ollama_spec.models.resolve import ResolvedModel, resolve_model
from ollama_spec.models.store import Store
from ollama_spec.pull.download import http_client
from ollama_spec.pull.fetcher import fetch_all
from ollama_spec.pull.head_checkpoint import HeadConfig, iter_tensors, read_head_config, weight_files
from ollama_spec.pull.head_convert import convert_head
from ollama_spec.pull.huggingface import (
    CONFIG_MEDIA_TYPE,
    MANIFEST_MEDIA_TYPE,
    hf_endpoint,
    is_huggingface,
    list_repo,
    small_file,
)
from ollama_spec.pull.progress import PullEvent
from ollama_spec.pull.settings import PullSettings
from ollama_spec.pull.writer import Blob, StoreWriter

MODEL_MEDIA_TYPE = MEDIA_TYPE_PREFIX + "model"
_WEIGHTS = re.compile(r"^[^/]*\.safetensors$")
_TORCH_WEIGHTS = re.compile(r"^pytorch_model[^/]*\.bin$")
Verify = Callable[[Path], object]  # raises OllamaSpecError when the file does not load


def pull_head(
    source: str,
    target_name: str,
    writer: StoreWriter,
    settings: PullSettings,
    report: Callable[[PullEvent], None],
    cancel: threading.Event,
    *,
    name: str | None = None,
    verify: Verify | None = None,
) -> str:
    """Convert the head at `source` (hf.co/<user>/<repo>, or a folder) for `target_name` and store it as `name`
    (default: the repo's name, or the folder's); return the stored name."""
    target = resolve_model(target_name, store=Store(writer.root))
    _require_target(target)
    folder = Path(source).expanduser()
    if folder.is_dir():
        ref = parse_model_name(name or _folder_name(folder))
        writer.prepare(ref)
        config = read_head_config(folder / "config.json", str(folder))
        _store_head(config, weight_files(folder), str(folder), target, ref, writer, report, verify)
        return ref.display
    if source.startswith(("/", "./", "../", "~")) or Path(source).exists():
        raise PullError(f"--head-for: {source} is no folder (a head checkpoint is a folder with config.json)")
    ref = parse_model_name(source)
    if not is_huggingface(ref):
        raise PullError(
            f"--head-for takes a Hugging Face repo (hf.co/<user>/<repo>) or a folder with config.json; '{source}' "
            "is neither"
        )
    stored_as = parse_model_name(name) if name else ref
    writer.prepare(stored_as)
    downloads = _download(ref, writer, settings, report, cancel)
    config_file = downloads.pop("config.json")
    try:
        config = read_head_config(config_file, f"hf.co/{ref.namespace}/{ref.model}")
    finally:
        config_file.unlink(missing_ok=True)
    files = sorted(downloads.values())
    _store_head(config, files, config.source, target, stored_as, writer, report, verify)
    for path in files:
        if path.parent == writer.partial_dir:  # a file the store already had as a blob stays
            path.unlink(missing_ok=True)  # converted and stored: the checkpoint is no blob Ollama would keep
    return stored_as.display


def _require_target(target: ResolvedModel) -> None:
    """Refuse up front, before any download, a target no head can draft for."""
    arch = target.info.architecture
    if is_head(target.info):
        raise PullError(f"--head-for {target.name}: that is an EAGLE-3 head itself; name the model it drafts for")
    if has_recurrent_state(arch):
        raise PullError(
            f"--head-for {target.name}: a recurrent or hybrid model ({arch}) cannot drop rejected drafts from its "
            "cache, so no head can draft for it"
        )


def _folder_name(folder: Path) -> str:
    return re.sub(r"[^a-z0-9_.-]+", "-", folder.resolve().name.lower()).strip("-.") or "eagle3-head"


def _download(
    ref: ModelRef,
    writer: StoreWriter,
    settings: PullSettings,
    report: Callable[[PullEvent], None],
    cancel: threading.Event,
) -> dict[str, Path]:
    """config.json and the weight files of the repo, verified, in the partial folder: {repo file name: path}."""
    repo_id, endpoint = f"{ref.namespace}/{ref.model}", hf_endpoint()
    report(PullEvent(ref.display, "pulling manifest"))
    revision, files = list_repo(repo_id, endpoint)
    names = {f.name for f in files}
    if "config.json" not in names:
        raise PullError(f"hf.co/{repo_id} has no config.json: it is no head checkpoint (a GGUF repo? pull it plainly)")
    weights = [f for f in files if _WEIGHTS.match(f.name)] or [f for f in files if _TORCH_WEIGHTS.match(f.name)]
    if not weights:
        raise PullError(f"hf.co/{repo_id} has no *.safetensors or pytorch_model.bin at its top level")
    for f in weights:
        if not f.sha256 or f.size is None:
            raise PullError(f"hf.co/{repo_id} gives no sha256 for {f.name} (not an LFS file), so it cannot be verified")
    blobs = {Blob(f"sha256:{f.sha256}", f.size): f.name for f in weights}
    with http_client() as client:
        client.headers.update(build_hf_headers())
        config = small_file(client, hf_hub_url(repo_id, "config.json", revision=revision, endpoint=endpoint), "config")
        urls = {blob: hf_hub_url(repo_id, file, revision=revision, endpoint=endpoint) for blob, file in blobs.items()}
        writer.check_free_space(urls)
        fetched = fetch_all(client, urls, writer, settings, ref, report, cancel)
    found = {blobs[blob]: path or writer.blob_path(blob) for blob, path in fetched.items()}
    with writer.writing():
        fd, staged = tempfile.mkstemp(dir=writer.partial_dir, prefix="layer-config-")
        with os.fdopen(fd, "wb") as f:
            f.write(config)
    return {"config.json": Path(staged), **found}


def _store_head(
    config: HeadConfig,
    files: list[Path],
    source: str,
    target: ResolvedModel,
    ref: ModelRef,
    writer: StoreWriter,
    report: Callable[[PullEvent], None],
    verify: Verify | None,
) -> None:
    """Convert into the partial folder, check, then the blob and its manifest into the store."""
    with writer.writing():
        fd, staged = tempfile.mkstemp(dir=writer.partial_dir, prefix="layer-head-")
        os.close(fd)
    out = Path(staged)
    try:
        tensors = list(iter_tensors(files, source))

        def progress(done: int, total: int) -> None:
            report(PullEvent(ref.display, "converting to GGUF", "convert", total, done))

        with writer.writing():
            convert_head(config, tensors, target.info, target.name, out, progress)
        report(PullEvent(ref.display, "verifying the head"))
        _verify(out, source, target, verify)
        blob = Blob(f"sha256:{_sha256(out)}", out.stat().st_size)
        model_layer = {"mediaType": MODEL_MEDIA_TYPE, "digest": blob.digest, "size": blob.size}
        image = {
            "model_format": "gguf",
            "model_family": "eagle3",
            "model_families": ["eagle3"],
            "model_type": read_model_info(out, read_vocab=False).parameter_label,
            "file_type": read_model_info(out, read_vocab=False).file_type,
            "eagle3_target": target.name,
            "rootfs": {"type": "layers", "diff_ids": [blob.digest]},
        }
        image_blob = writer.add_bytes(json.dumps(image).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "config": {"mediaType": CONFIG_MEDIA_TYPE, "digest": image_blob.digest, "size": image_blob.size},
            "layers": [model_layer],
        }
        report(PullEvent(ref.display, "writing manifest"))
        writer.write_manifest(ref, json.dumps(manifest).encode(), {blob: out})
    finally:
        out.unlink(missing_ok=True)
    report(PullEvent(ref.display, f"stored as an EAGLE-3 head for {target.name}"))
    report(PullEvent(ref.display, "success"))  # the last event, as Ollama's own pull stream ends


def _verify(out: Path, source: str, target: ResolvedModel, verify: Verify | None) -> None:
    head = read_model_info(out)
    problems = check_compatibility(target.info, head).problems
    if problems:
        raise PullError(f"{source} cannot draft for {target.name}: {'; '.join(problems)}; nothing was stored")
    if verify is not None:
        try:
            verify(out)
        except OllamaSpecError as exc:
            raise PullError(f"{source}: the converted head does not load: {one_line(str(exc))}") from None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            digest.update(chunk)
    return digest.hexdigest()
