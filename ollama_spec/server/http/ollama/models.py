"""Ollama's model routes: /api/tags, /api/show, /api/ps, /api/version and the "Ollama is running" probe:
the store's runnable models (or the one pinned pair; with --upstream, the daemon's after ours), and what
is loaded. Field names follow Ollama's api/types.go. (/api/pull, /api/delete, /api/copy: manage.py.)"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from datetime import datetime, timedelta, timezone
from typing import Any

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from fastapi.responses import PlainTextResponse

from ollama_spec import __version__
from ollama_spec.errors import InvalidModelName, one_line
from ollama_spec.llama.load_params import gpu_offload_supported
from ollama_spec.llama.model import LoadedModel
from ollama_spec.models.names import parse_model_name
from ollama_spec.models.resolve import ResolvedModel
from ollama_spec.prompting.thinking import template_thinks
from ollama_spec.server.http.parsed import ParsedRoute
from ollama_spec.server.http.upstream import merge_tags
from ollama_spec.server.protocol.errors import ApiError
from ollama_spec.server.protocol.ollama import ShowRequest, iso
from ollama_spec.server.serving.loaded import Served
from ollama_spec.server.serving.state import ServerState

router = APIRouter(route_class=ParsedRoute)

# The Ollama release whose API this mirrors: clients and front-ends gate features on /api/version.
OLLAMA_API_VERSION = "0.12.0"
# Ollama keeps a model "forever" for Go's longest duration (2^63-1 ns, about 292 years) and shows that expiry
GO_FOREVER = timedelta(microseconds=(2**63 - 1) // 1000)


@router.api_route("/", methods=["GET", "HEAD"], response_class=PlainTextResponse)
async def probe() -> str:
    return "Ollama is running"


@router.api_route("/api/version", methods=["GET", "HEAD"])
async def version() -> dict:
    return {"version": OLLAMA_API_VERSION, "ollama_spec": __version__}


@router.api_route("/api/tags", methods=["GET", "HEAD"])
async def tags(http_request: HTTPRequest) -> dict:
    state: ServerState = http_request.app.state.server
    loaded = {served.name: served for served in state.loaded()}
    ours = [
        _model_entry(model, name) | {"capabilities": _capabilities(loaded.get(model.name), model.info)}
        for name, model in await asyncio.to_thread(state.listed)
    ]
    if state.upstream is None or state.serving.answers_every_name:
        return {"models": ours}
    return {"models": merge_tags(ours, await state.upstream.tags())}


@router.api_route("/api/ps", methods=["GET", "HEAD"])
async def ps(http_request: HTTPRequest) -> dict:
    state: ServerState = http_request.app.state.server
    return {"models": [_running(served) for served in state.in_memory()]}


def _running(served: Served) -> dict:
    """One pair in memory as Ollama's /api/ps lists it, with its draft and why. One unloading once its
    running requests end expires when it was told to: in the past, which `ollama ps` shows as "Stopping..."."""
    engine = served.engine
    pair = [(engine.target_model, engine.target, bool(engine.placement.rpc_servers))]
    if engine.draft_model is not None and engine.draft is not None:
        pair.append((engine.draft_model, engine.draft, False))
    if served.unloading_since:
        expires = served.unloading_since
    else:
        expires = time.time() + served.keep_alive if served.users else served.expires_at
    return _model_entry(engine.target_model, served.model_name) | {
        "size": sum(model.info.file_size for model, _, _ in pair),
        "size_vram": sum(_on_gpu(*loaded) for loaded in pair),
        "expires_at": _expiry(expires),
        "context_length": engine.target.n_ctx,
        "draft": {"model": served.proposer_name, "reason": served.draft_why or None},
    }


def _expiry(expires: float) -> str:
    """When a model is unloaded, as Ollama writes it; kept forever (a pinned pair, a keep_alive of -1 or
    past Go's longest duration): now plus that longest duration, as Ollama shows it ("Forever")."""
    now = datetime.now(timezone.utc)
    if math.isfinite(expires) and expires - now.timestamp() < GO_FOREVER.total_seconds():
        return iso(datetime.fromtimestamp(expires, timezone.utc))
    return iso(now + GO_FOREVER)


def _capabilities(served: Served | None, info) -> list[str]:
    """What Ollama's clients check before they offer tools or thinking, or embed. As Ollama says it: an
    embedding model (pooling_type in its header) is "embedding" alone, any other "completion" (and
    never "embedding", which sends `ollama run` into embedding mode; /api/embed works anyway). Tools
    work with any chat template here: one without a place for them gets them in the system message.
    Fill in the middle: the loaded vocabulary's markers, else the header's."""
    if f"{info.architecture}.pooling_type" in info.metadata:
        return ["embedding"]
    if served is not None:
        insert = served.engine.target.fill_in_the_middle_tokens() is not None
    else:
        insert = all(f"tokenizer.ggml.fim_{part}_token_id" in info.metadata for part in ("pre", "suf", "mid"))
    return [
        "completion",
        *(["tools"] if info.chat_template else []),
        *(["thinking"] if template_thinks(info.chat_template) else []),
        *(["insert"] if insert else []),
    ]


def _model_info(metadata: dict[str, Any]) -> dict[str, Any]:
    """The GGUF header's keys as Ollama's /api/show gives them: without the name and the chat template
    (said elsewhere), an array of more than 5 items as [] (Ollama's own answer unless verbose), and a
    number JSON cannot hold (inf, nan) as null."""
    shown = {}
    for key, value in metadata.items():
        if key in ("general.name", "tokenizer.chat_template"):
            continue
        if isinstance(value, (tuple, list)):
            value = list(value) if len(value) <= 5 else []
        elif not isinstance(value, (str, int, float, bool)):  # an array whose items were not read
            value = []
        shown[key] = _finite(value)
    return shown


def _finite(value: Any) -> Any:
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _on_gpu(model: ResolvedModel, loaded: LoadedModel, remote: bool) -> int:
    """Bytes of a model's weights on GPUs, this machine's or (`remote`) RPC servers': its offloaded
    share of the layers (llama.cpp counts the output layer as one more); 0 on a CPU."""
    if not (gpu_offload_supported() or remote):
        return 0
    layers, blocks = loaded.settings.n_gpu_layers, model.info.block_count or 0
    if layers < 0 or layers > blocks:
        return model.info.file_size
    return model.info.file_size * layers // (blocks + 1)


@router.api_route("/api/show", methods=["GET", "POST"])
async def show(http_request: HTTPRequest, body: ShowRequest | None = None) -> dict:
    state: ServerState = http_request.app.state.server
    name = body.model or body.name if body is not None else None
    if (body is not None or not state.serving.answers_every_name) and not name:
        raise ApiError(400, "model is required", "model")  # Ollama's words; a GET without a body shows the pair
    if name and (problem := _name_problem(name, state.serving.answers_every_name)):
        raise ApiError(400, one_line(f"invalid model name {json.dumps(name, ensure_ascii=False)}: {problem}"), "model")
    served, model, draft, why = await state.describe(name or "")
    capabilities = _capabilities(served, model.info)
    info = model.info
    pairs = [
        (key, value)
        for key, values in model.params.items()
        for value in (values if isinstance(values, list) else [values])
    ]
    return {
        "modelfile": _modelfile(model, pairs),
        # as Ollama lays them out (Go's "%-30s %#v"): clients read stop and num_ctx from here
        "parameters": "\n".join(f"{key:<30} {_go_value(value)}" for key, value in pairs),
        **({"license": model.license} if model.license else {}),
        "template": info.chat_template or "",
        "system": model.system or "",
        "details": _details(model),
        "model_info": _model_info(info.metadata)
        | {
            "general.architecture": info.architecture,
            "general.parameter_count": info.parameter_count,
            f"{info.architecture}.context_length": info.context_length,
            f"{info.architecture}.block_count": info.block_count,
            f"{info.architecture}.embedding_length": info.embedding_length,
        },
        "capabilities": capabilities,
        "tensors": [{"name": t.name, "type": t.type_name, "shape": list(t.shape)} for t in info.tensors],
        "modified_at": _mtime(model),
        # loaded: the draft that drafts now (a default let go at load is none); else the pair's choice, which
        # for a target's own MTP layers is a default priced as it loads
        "speculation": {
            "draft": draft,
            "draft_reason": why or None,
            "num_speculative_tokens": _k(served),
            "loaded": served is not None,
        },
    }


def _k(served: Served | None) -> int | None:
    """The K a loaded pair drafts at (None: auto, or not loaded); 0 where nobody drafts."""
    if served is None:
        return None
    return served.settings.speculation.num_speculative_tokens if served.proposer_name is not None else 0


def _name_problem(name: str, any_name: bool) -> str | None:
    """Why /api/show refuses `name` (Ollama's "invalid model name"), or None: spaces around it (no stored
    name has them), or, where names are the store's (`any_name` False), a name Ollama would not parse."""
    if name != name.strip():
        return "a model name has no spaces around it"
    if any_name:
        return None
    try:
        parse_model_name(name)
    except InvalidModelName as exc:
        return str(exc).split(": ", 1)[-1]
    return None


def _model_entry(model: ResolvedModel, name: str) -> dict:
    """A model as /api/tags and /api/ps name it, from what was read with its manifest (no file is read
    here): Ollama's digest is the sha256 of the manifest, its size every layer's."""
    listing = model.listing
    return {
        "name": name,
        "model": name,
        "modified_at": _mtime(model),
        "size": listing.size if listing else model.info.file_size,
        "digest": listing.digest if listing else "",
        "details": _details(model),
    }


def _details(model: ResolvedModel) -> dict:
    info = model.info
    return {
        "parent_model": "",
        "format": "gguf",
        "family": info.architecture,
        "families": [info.architecture],
        "parameter_size": info.parameter_label,
        "quantization_level": info.file_type,
        **({"context_length": info.context_length} if info.context_length else {}),
        **({"embedding_length": info.embedding_length} if info.embedding_length else {}),
    }


def _param_text(value: Any) -> str:
    return json.dumps(value) if isinstance(value, str) and re.search(r"\s", value) else str(value)


def _go_value(value: Any) -> str:
    """A parameter as Go's %#v writes the JSON value Ollama holds: strings quoted, whole numbers bare."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _modelfile(model: ResolvedModel, params: list[tuple[str, Any]]) -> str:
    """A Modelfile of the served target, as `ollama show --modelfile` writes one (less the TEMPLATE:
    the GGUF's chat template is the one used here, and it is given apart)."""
    lines = [
        '# Modelfile generated by "ollama show"',
        f"FROM {model.path}",
        *(f"ADAPTER {path}" for path in model.adapter_paths),
        *(f"PARAMETER {key} {_param_text(value)}" for key, value in params),
    ]
    if model.system:
        lines.append(f'SYSTEM """{model.system}"""')
    if model.license:
        lines.append(f'LICENSE """{model.license}"""')
    return "\n".join(lines) + "\n"


def _mtime(model: ResolvedModel) -> str:
    return iso(datetime.fromtimestamp(model.listing.modified if model.listing else 0.0, timezone.utc))
