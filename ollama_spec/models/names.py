"""Ollama model names: `llama3.1:70b`, `user/model`, `hf.co/user/repo:Q4_K_M`, `host:port/ns/model:tag`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ollama_spec.errors import InvalidModelName

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"
# Ollama's isValidLen (types/model/name.go): a host of up to 350 characters, every other part up to 80
MAX_HOST_LENGTH = 350
MAX_PART_LENGTH = 80

# Character sets follow Ollama's isValidByteFor: namespaces may not contain dots; hosts may
# carry a port. Every part must start with a letter, digit or underscore, which (with the
# ban on "..") keeps "." / ".." / "-x" out of the manifest path.
_PART_PATTERNS = {
    "host": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*(:[0-9]{1,5})?"),
    "namespace": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]*"),
    "model": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*"),
    "tag": re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*"),
}


@dataclass(frozen=True)
class ModelRef:
    """A fully qualified model name; `manifest_parts` is its path under `manifests/`."""

    host: str
    namespace: str
    model: str
    tag: str

    @property
    def manifest_parts(self) -> tuple[str, str, str, str]:
        return (self.host, self.namespace, self.model, self.tag)

    @property
    def display(self) -> str:
        """The short form Ollama prints: `llama3.1:70b`, `user/model:latest`, `hf.co/u/r:Q4_K_M`."""
        if self.host.lower() == DEFAULT_HOST:
            prefix = "" if self.namespace.lower() == DEFAULT_NAMESPACE else f"{self.namespace}/"
        else:
            prefix = f"{self.host}/{self.namespace}/"
        return f"{prefix}{self.model}:{self.tag}"

    def __str__(self) -> str:
        return self.display


def parse_model_name(name: str) -> ModelRef:
    """Parse a name the way Ollama does; raise InvalidModelName with the reason."""
    original = name
    name = _without_source_suffix(name.strip(), original)
    for scheme in ("https://", "http://"):
        if name.lower().startswith(scheme):
            name = name[len(scheme) :]
            break
    if not name:
        raise InvalidModelName("invalid model name '': the name is empty")

    tag = DEFAULT_TAG
    colon, slash = name.rfind(":"), name.rfind("/")
    if colon > slash:  # a ':' before the last '/' is a host port, not a tag
        name, tag = name[:colon], name[colon + 1 :]
        _check_part(original, "tag", tag)

    parts = name.split("/")
    if len(parts) > 3:
        raise InvalidModelName(f"invalid model name '{original}': expected [host/][namespace/]model[:tag]")
    host, namespace = DEFAULT_HOST, DEFAULT_NAMESPACE
    if len(parts) == 3:
        host, namespace, model = parts
        _check_part(original, "host", host)
    elif len(parts) == 2:
        namespace, model = parts
    else:
        (model,) = parts
    _check_part(original, "namespace", namespace)
    _check_part(original, "model", model)
    return ModelRef(host=host, namespace=namespace, model=model, tag=tag)


def _without_source_suffix(name: str, original: str) -> str:
    """Ollama's modelref.ParseRef and NormalizePullName: `model:local` and `model:tag:local` are the
    stored model; `model:cloud` / `model:tag:cloud` the stored cloud stub, kept as `model:cloud` /
    `model:tag-cloud` (a `-cloud` tag is left as it is)."""
    base, source = _source_suffix(name)
    if source is None:
        return name
    if _source_suffix(base)[1] is not None:
        raise InvalidModelName(f"invalid model name '{original}': use either :local or :cloud, not both")
    if source == "local":
        return base
    colon, slash = base.rfind(":"), base.rfind("/")
    return f"{base}-cloud" if colon > slash else f"{base}:cloud"


def _source_suffix(name: str) -> tuple[str, str | None]:
    colon = name.rfind(":")
    suffix = name[colon + 1 :].strip().lower() if colon >= 0 else ""
    return (name[:colon], suffix) if suffix in ("local", "cloud") else (name, None)


def is_valid_ref(parts: tuple[str, ...]) -> bool:
    """Whether host/namespace/model/tag (a manifest's path parts) make a name Ollama accepts."""
    if len(parts) != 4:
        return False
    kinds = ("host", "namespace", "model", "tag")
    return all(
        0 < len(p) <= _max_length(k) and ".." not in p and _PART_PATTERNS[k].fullmatch(p) for k, p in zip(kinds, parts)
    )


def _max_length(kind: str) -> int:
    return MAX_HOST_LENGTH if kind == "host" else MAX_PART_LENGTH


def _check_part(original: str, kind: str, part: str) -> None:
    if not part:
        raise InvalidModelName(f"invalid model name '{original}': the {kind} is empty")
    if len(part) > _max_length(kind):
        raise InvalidModelName(
            f"invalid model name '{original}': the {kind} is longer than {_max_length(kind)} characters"
        )
    if ".." in part or not _PART_PATTERNS[kind].fullmatch(part):
        raise InvalidModelName(f"invalid model name '{original}': {kind} '{part}' has characters Ollama does not allow")
