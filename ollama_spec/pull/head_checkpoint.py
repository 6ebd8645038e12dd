"""A published EAGLE-3 head checkpoint read without torch: its config.json and its tensors as numpy arrays.

Two layouts are published. EAGLE's own (`LlamaForCausalLMEagle3`, e.g. yuhuili/EAGLE3-LLaMA3.1-Instruct-8B)
keeps the decoder layer under `midlayer.*` and the Llama hyper-parameters at the top of config.json; vLLM's
speculators (`Eagle3Speculator`, e.g. RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3) keep it under
`layers.0.*` and nest the hyper-parameters in `transformer_layer_config`. Like llama.cpp's converter
(conversion/llama.py), a checkpoint is a head when its config has `draft_vocab_size` and one hidden layer.
Tensors come from `*.safetensors` files (gguf's own reader, memory-mapped) or from a `pytorch_model.bin`
(pull/torch_pickle, which reads the zip and its pickle without running any of it).
"""

from __future__ import annotations

import json
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf.utility import SafetensorsLocal

from ollama_spec.errors import PullError
from ollama_spec.pull.torch_pickle import read_torch_checkpoint

HEAD_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator", "Eagle3DraftModel")
SAFETENSORS_DTYPES = {"F16": "<f2", "BF16": "<u2", "F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4", "BOOL": "?"}
WEIGHT_SUFFIXES = (".safetensors", ".bin")


@dataclass(frozen=True)
class HeadConfig:
    """A head checkpoint's config.json, the speculators' nesting flattened as llama.cpp flattens it."""

    source: str  # for messages: the folder or the repo
    hparams: dict[str, Any]
    layout: str  # "eagle" (midlayer.*) or "speculators" (layers.0.*)

    @property
    def architecture(self) -> str:
        names = self.hparams.get("architectures") or ["?"]
        return str(names[0]) if isinstance(names, list) and names else "?"

    def count(self, key: str, default: int | None = None) -> int:
        """A positive whole hyper-parameter; PullError naming it when it is missing or not one."""
        value = self.hparams.get(key, default)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise PullError(f"{self.source}: config.json has no usable {key} ({value!r})")
        return value

    def target_layers(self, target_layer_count: int) -> list[int]:
        """`eagle_aux_hidden_state_layer_ids` when the config names them, else llama.cpp's default for the target:
        [2, N/2, N-3]."""
        named = self.hparams.get("eagle_aux_hidden_state_layer_ids")
        if named is None and isinstance(self.hparams.get("eagle_config"), dict):
            named = self.hparams["eagle_config"].get("eagle_aux_hidden_state_layer_ids")
        if not named:
            return [2, target_layer_count // 2, target_layer_count - 3]
        if not isinstance(named, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in named):
            raise PullError(
                f"{self.source}: eagle_aux_hidden_state_layer_ids is not a list of layer numbers: {named!r}"
            )
        return named


def read_head_config(path: Path, source: str) -> HeadConfig:
    """config.json of a head checkpoint; PullError when it is unreadable or describes no EAGLE-3 head."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PullError(f"{source} has no config.json: it is no head checkpoint") from None
    except (OSError, ValueError) as exc:
        raise PullError(f"{source}: cannot read config.json ({exc})") from None
    if not isinstance(raw, dict):
        raise PullError(f"{source}: config.json is not a JSON object")
    nested = raw.get("transformer_layer_config")
    hparams = {**raw, **nested} if isinstance(nested, dict) else dict(raw)
    config = HeadConfig(source, hparams, "speculators" if isinstance(nested, dict) else "eagle")
    if "draft_vocab_size" not in hparams or hparams.get("num_hidden_layers") != 1:
        why = (
            f"{hparams.get('num_hidden_layers')} hidden layers"
            if hparams.get("num_hidden_layers") != 1
            else "no draft_vocab_size"
        )
        raise PullError(
            f"{source} is not an EAGLE-3 head: its config.json ({config.architecture}) has {why}, and a head has "
            "draft_vocab_size and one hidden layer; pull a model repo without --head-for"
        )
    return config


def weight_files(folder: Path) -> list[Path]:
    """The checkpoint's weight files: every `*.safetensors`, else `pytorch_model*.bin`."""
    safetensors = sorted(folder.glob("*.safetensors"))
    return safetensors or sorted(folder.glob("pytorch_model*.bin"))


@dataclass(frozen=True)
class SourceTensor:
    """One tensor of a checkpoint, not read yet: `load()` gives its array (BF16 as raw uint16 bits)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # F16, BF16, F32, F64, I64, I32, BOOL
    load: Callable[[], np.ndarray]


def iter_tensors(files: list[Path], source: str) -> Iterator[SourceTensor]:
    """Every tensor of the checkpoint's weight files, not read yet."""
    if not files:
        raise PullError(f"{source} has no weights (*.safetensors or pytorch_model.bin)")
    for path in files:
        if zipfile.is_zipfile(path):  # torch.save's format, whatever the file is called (downloads are not)
            yield from (SourceTensor(*found) for found in read_torch_checkpoint(path))
            continue
        try:
            tensors = SafetensorsLocal(path).tensors
        except (OSError, ValueError, KeyError, UnicodeDecodeError) as exc:
            raise PullError(f"{source}: {path.name} is not a readable safetensors file ({exc})") from None
        for name, tensor in tensors.items():
            dtype = SAFETENSORS_DTYPES.get(tensor.dtype)
            if dtype is None:
                raise PullError(
                    f"{source}: tensor {name} in {path.name} has type {tensor.dtype}, which is not supported"
                )
            yield SourceTensor(name, tuple(tensor.shape), tensor.dtype, _safetensors_loader(tensor, dtype))


def _safetensors_loader(tensor, dtype: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        return tensor.mmap_bytes().view(dtype).reshape(tensor.shape)

    return load
