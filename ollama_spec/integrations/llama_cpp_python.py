"""`OllamaDraftModel`: an Ollama-resolved draft for llama-cpp-python's own `draft_model` hook.

    from llama_cpp import Llama
    from ollama_spec.integrations.llama_cpp_python import OllamaDraftModel, ollama_model_path

    llm = Llama(model_path=ollama_model_path("llama3.1:8b"), n_ctx=4096, n_gpu_layers=-1,
                draft_model=OllamaDraftModel("llama3.2:1b", num_pred_tokens=5), logits_all=True)

Caveats of that path (llama-cpp-python 0.3.36), which ollama-spec's own engine avoids:
- it compares the target's *sampled* token with the draft's, so at temperature > 0 it accepts
  less than rejection sampling does (the output is still the target's distribution);
- it keeps logits for every position: n_ctx x n_vocab x 4 bytes (3.9 GiB at 8k context with a
  128k vocabulary). Pass `logits_all=True` yourself: without it generation fails after about
  n_batch (512) tokens with "could not broadcast input array".
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from llama_cpp.llama_speculative import LlamaDraftModel

from ollama_spec.decoding.proposers import as_draft_tokens, keep_common_prefix
from ollama_spec.errors import UnusableModel
from ollama_spec.llama.canary import decide_repack
from ollama_spec.llama.load_params import choose_flash_attention
from ollama_spec.llama.model import LoadedModel, LoadSettings
from ollama_spec.models.compat import load_kv_overrides
from ollama_spec.models.resolve import resolve_model


def ollama_model_path(name: str, models_dir: str | None = None) -> str:
    """The GGUF blob of an Ollama model, for `Llama(model_path=...)`.

    A model with a LoRA adapter layer (an Ollama fine-tune) is refused: its blob alone is the base
    model. Load it with `lora_path=ollama_adapter_paths(name)[0]` too (one adapter; llama-cpp-python's
    `Llama` takes one)."""
    model = resolve_model(name, models_dir)
    if model.adapters:
        raise UnusableModel(
            f"{model.name} has {len(model.adapters)} LoRA adapter layer(s): its blob alone is the "
            "base model; pass lora_path=ollama_adapter_paths(name)[0] to Llama as well"
        )
    return str(model.path)


def ollama_adapter_paths(name: str, models_dir: str | None = None) -> list[str]:
    """The GGUF LoRA adapters an Ollama model applies over its blob, in order (usually none)."""
    return [str(path) for path in resolve_model(name, models_dir).adapter_paths]


class OllamaDraftModel(LlamaDraftModel):
    """Greedy drafts from an Ollama model; keeps its KV cache across calls (prefix reuse)."""

    def __init__(
        self,
        name: str,
        *,
        num_pred_tokens: int = 5,
        models_dir: str | None = None,
        n_ctx: int = 4096,
        n_gpu_layers: int = -1,
        n_threads: int | None = None,
        repack: bool | None = None,
    ):
        resolved = resolve_model(name, models_dir)
        overrides = load_kv_overrides(resolved.info)
        self.name = resolved.name
        self.num_pred_tokens = num_pred_tokens
        settings = LoadSettings(
            n_ctx=n_ctx,
            n_gpu_layers=n_gpu_layers,
            n_threads=n_threads,
            kv_overrides=overrides,
            use_extra_bufts=decide_repack(repack).enabled,
            lora_adapters=resolved.adapter_paths,
            # as the engine loads a draft: off on a CPU, where it slows steps deep in a context
            flash_attention=choose_flash_attention("auto", gpu_layers=n_gpu_layers),
        )
        self.model = LoadedModel(Path(resolved.path), settings)

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        ids = as_draft_tokens([int(t) for t in input_ids], self.model.n_vocab)
        common = keep_common_prefix(self.model, ids)  # the last token is always re-read for its logits
        room = self.model.n_ctx - len(ids)
        if room <= 0 or not ids:
            return np.array([], dtype=np.intc)
        logits = self.model.eval(ids[common:])[-1]
        drafted: list[int] = []
        for _ in range(min(self.num_pred_tokens, room)):
            token = int(logits.argmax())
            drafted.append(token)
            if len(drafted) < min(self.num_pred_tokens, room):
                logits = self.model.eval([token])[-1]
        # The cache keeps the drafts it read: the next call's common prefix keeps those the target
        # accepted, so they are not read again (up to 9 % of drafting time on SmolLM2-135M).
        return np.array(drafted, dtype=np.intc)

    def reset(self) -> None:
        """Forget the cached prefix: the next call starts cold, as for a new conversation."""
        self.model.truncate(0)

    def close(self) -> None:
        self.model.close()
