"""Ollama names → the Hugging Face repositories of their original weights, for vLLM.

vLLM loads a model's original (safetensors) weights, not Ollama's GGUF blobs, so `llama3.1:70b`
has to become `meta-llama/Llama-3.1-70B-Instruct`. The table is data, kept beside the presets
(modelfiles/hf-repos.json); a quantization in the tag (`70b-instruct-q4_K_M`) names Ollama's copy
of the same model, so it maps to the same repository. An `org/name` is taken as a repository as
it is.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from ollama_spec.errors import IncompatibleDraft, NoHfRepo
from ollama_spec.models.modelfile import PRESETS_DIR
from ollama_spec.models.names import DEFAULT_HOST, DEFAULT_NAMESPACE, DEFAULT_TAG, parse_model_name

REPOS_FILE = PRESETS_DIR / "hf-repos.json"
HF_HOSTS = ("hf.co", "huggingface.co")
# A Hugging Face repository id: one slash, no tag (Ollama's `user/model` needs a ':tag' to be read as one).
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*")
# Ollama's quantization suffixes: q4_K_M, q8_0, iq2_xs, fp16, bf16, ...
_QUANT = re.compile(r"(i?q\d\w*|fp16|f16|bf16|fp32|f32|fp8)", re.IGNORECASE)
_VARIANTS = {"instruct": "instruct", "text": "base", "base": "base"}
_SIZE = re.compile(r"(\d+(?:\.\d+)?)b", re.IGNORECASE)
PASS_A_REPO = "pass a Hugging Face repository as org/name instead (e.g. meta-llama/Llama-3.1-8B-Instruct)"


@dataclass(frozen=True)
class HfModel:
    """What vLLM is given for one Ollama name, and what the table knows about it."""

    name: str  # as the user gave it
    repo: str
    tokenizer: str | None = None  # models with the same tokenizer group can draft for each other
    vocab_size: int | None = None  # config.json's, which vLLM compares
    parameters: float | None = None  # billions, from the size tag (70b → 70.0)
    gated: bool = False
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class PairCheck:
    """What the table says about a target/draft pair before vLLM loads anything."""

    known: bool  # both models are in the table; else vLLM checks the vocabularies when it loads them
    same_vocab_size: bool  # vLLM's draft_model method compares config.json's vocab_size exactly


@lru_cache(maxsize=4)
def load_table(path: Path = REPOS_FILE) -> dict[str, Any]:
    """The families in the mapping file, keyed by Ollama model name."""
    with open(path, encoding="utf-8") as f:
        return json.load(f)["families"]


def to_hf(name: str, table: dict[str, Any] | None = None) -> HfModel:
    """The repository vLLM should load for `name` (an Ollama name or an `org/name` repository)."""
    table = load_table() if table is None else table
    name = name.strip()
    if _REPO_ID.fullmatch(name) and not name.lower().startswith(f"{DEFAULT_NAMESPACE}/"):
        return _known_repo(name, table) or HfModel(name, name, notes=(f"{name}: passed to vLLM as it is",))
    ref = parse_model_name(name)
    if ref.host.lower() in HF_HOSTS:
        raise NoHfRepo(
            f"{name} is a GGUF repository on Hugging Face, and vLLM loads original (safetensors) "
            "weights: pass the repository it was converted from as org/name (its model card names it, "
            "usually as base_model)"
        )
    family = table.get(ref.model.lower())
    if ref.host.lower() != DEFAULT_HOST or ref.namespace.lower() != DEFAULT_NAMESPACE or family is None:
        raise NoHfRepo(
            f"no Hugging Face repository is known for {name} (known: {', '.join(sorted(table))}); "
            f"{PASS_A_REPO}, or add it to {REPOS_FILE.name}"
        )
    return _from_tag(name, ref.model.lower(), ref.tag, family)


def check_pair(target: HfModel, draft: HfModel) -> PairCheck:
    """Refuse a draft from another tokenizer family; say whether config.json's vocab sizes match."""
    if target.tokenizer is None or draft.tokenizer is None:
        return PairCheck(known=False, same_vocab_size=True)
    if target.tokenizer != draft.tokenizer:
        raise IncompatibleDraft(
            f"{draft.name} ({draft.repo}) cannot draft for {target.name} ({target.repo}): "
            f"different tokenizers ({draft.tokenizer} vs {target.tokenizer}); pick a draft "
            "of the target's family"
        )
    return PairCheck(known=True, same_vocab_size=target.vocab_size == draft.vocab_size)


def _from_tag(name: str, model: str, tag: str, family: dict[str, Any]) -> HfModel:
    sizes = family["sizes"]
    parts = (family["latest"] if tag.lower() == DEFAULT_TAG else tag).split("-")
    size = sizes.get(parts[0].lower())
    if size is None:
        raise NoHfRepo(
            f"no Hugging Face repository is known for {name}: {model} sizes known are {', '.join(sizes)}; {PASS_A_REPO}"
        )
    variant, quant = "instruct", None
    for part in parts[1:]:
        if part.lower() in _VARIANTS:
            variant = _VARIANTS[part.lower()]
        elif _QUANT.fullmatch(part):
            quant = part
        else:
            raise NoHfRepo(
                f"no Hugging Face repository is known for {name}: tag part '{part}' is neither "
                f"instruct/text/base nor a quantization; {PASS_A_REPO}"
            )
    repo = size.get(variant)
    if repo is None:
        raise NoHfRepo(
            f"no Hugging Face repository is known for {name}: {model}:{parts[0]} has no {variant} "
            f"weights listed; {PASS_A_REPO}"
        )
    notes = (f"{quant} is Ollama's quantization of {repo}: vLLM loads the original weights",) if quant else ()
    return _model(name, repo, family, size, parts[0], notes)


def _known_repo(repo: str, table: dict[str, Any]) -> HfModel | None:
    """A repository given as org/name, with what the table knows about it (for the pair check)."""
    for family in table.values():
        for label, size in family["sizes"].items():
            if repo.lower() in (size.get("instruct", "").lower(), size.get("base", "").lower()):
                return _model(repo, repo, family, size, label, ())
    return None


def _model(name: str, repo: str, family: dict[str, Any], size: dict[str, Any], label: str, notes) -> HfModel:
    match = _SIZE.fullmatch(label)
    return HfModel(
        name,
        repo,
        tokenizer=family.get("tokenizer"),
        vocab_size=size.get("vocab_size"),
        parameters=float(match.group(1)) if match else None,
        gated=bool(family.get("gated")),
        notes=tuple(notes),
    )
