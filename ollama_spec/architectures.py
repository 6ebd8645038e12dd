"""Architecture families whose cache works differently from a per-token KV cache.

The names are llama.cpp's (`llm_arch_is_recurrent` / `llm_arch_is_hybrid` in src/llama-arch.cpp,
as `general.architecture` spells them). A recurrent model keeps one running state per sequence
instead of one KV entry per token, so its cache cannot drop a suffix: speculative decoding, which
drops the rejected drafts every step, cannot use it as target or draft. Hybrid models mix
attention layers with recurrent ones and have the same limit.
"""

from __future__ import annotations

RECURRENT_ARCHITECTURES = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHITECTURES = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)


def is_recurrent(architecture: str) -> bool:
    return architecture in RECURRENT_ARCHITECTURES


def is_hybrid(architecture: str) -> bool:
    return architecture in HYBRID_ARCHITECTURES


def cannot_roll_back(architecture: str) -> bool:
    """True when the model's cache cannot forget its last tokens (recurrent or hybrid)."""
    return is_recurrent(architecture) or is_hybrid(architecture)
