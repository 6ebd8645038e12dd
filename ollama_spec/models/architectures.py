"""Which GGUF architectures keep a recurrent state instead of (or beside) a per-token KV cache.

Copied from llama.cpp's `llm_arch_is_recurrent` / `llm_arch_is_hybrid` (src/llama-arch.cpp, as
vendored by llama-cpp-python 0.3.36), by the `general.architecture` names its LLM_ARCH_NAMES
table gives them. A recurrent cache cannot drop a suffix, so these models cannot roll back
rejected drafts; their memory is sized differently (a fixed state per sequence).
"""

from __future__ import annotations

RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset(
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


def is_recurrent(arch: str | None) -> bool:
    """Every layer keeps a recurrent state (Mamba, RWKV): no per-token KV cache at all."""
    return arch in RECURRENT_ARCHS


def is_hybrid(arch: str | None) -> bool:
    """Some layers attend (per-token KV cache), the others keep a recurrent state (Jamba, LFM2, ...)."""
    return arch in HYBRID_ARCHS


def has_recurrent_state(arch: str | None) -> bool:
    """Recurrent or hybrid: the cache cannot be cut back to an earlier position."""
    return is_recurrent(arch) or is_hybrid(arch)


# Architectures whose NextN (MTP) layers llama.cpp can draft with: the ones whose src/models/<arch>.cpp
# builds an LLM_GRAPH_TYPE_DECODER_MTP graph. A GGUF says it carries such layers with
# `{arch}.nextn_predict_layers` (ModelInfo.nextn_layers).
MTP_ARCHS = frozenset(
    {
        "bailingmoe3",
        "cohere2moe",
        "deepseek2",
        "deepseek32",
        "deepseek4",
        "glm-dsa",
        "glm4moe",
        "glm5-next",
        "hy_v3",
        "mimo2",
        "nemotron_h_moe",
        "qwen35",
        "qwen35moe",
        "qwen3next",
        "step35",
    }
)


def drafts_with_nextn(arch: str | None) -> bool:
    """llama.cpp builds an MTP draft graph over this architecture's NextN layers."""
    return arch in MTP_ARCHS


# Sliding-window architectures whose target gets a window-sized cache (a plain window, not Llama
# 4's chunks), with llama.cpp's default layer pattern (every n-th layer global) and window when the
# GGUF names none (src/models/<arch>.cpp). Others keep a full-size cache for every layer.
WINDOW_CACHE_PATTERNS = {"gemma2": 2, "gemma3": 6, "gpt-oss": 2, "cohere2": 4}
DEFAULT_WINDOWS = {"gemma2": 4096}


def takes_window_cache(arch: str | None) -> bool:
    return arch in WINDOW_CACHE_PATTERNS
