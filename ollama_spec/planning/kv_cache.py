"""What a context costs: a per-token KV cache for attention layers, a fixed state for recurrent ones.

llama.cpp's rules (llama-cpp-python 0.3.36's vendored source):
- attention layers: context (padded to 256 cells) x (K width + V width) x element size, where
  the widths are the layer's KV heads x key/value head size. A sliding-window target's window
  layers hold the window and one batch instead (llama-kv-cache-iswa.cpp, without swa_full).
- recurrent layers (Mamba, RWKV, and the recurrent layers of hybrids such as Jamba, LFM2,
  granite-4.0-h): one F32 state per sequence of `n_embd_r + n_embd_s` values
  (llama-hparams.cpp), whatever the context; `llama_model::create_memory` decides which layers
  are which (hybrids: mostly the layers whose `head_count_kv` entry is 0).
"""

from __future__ import annotations

from ollama_spec.errors import CorruptGGUF
from ollama_spec.models.architectures import (
    DEFAULT_WINDOWS,
    WINDOW_CACHE_PATTERNS,
    is_hybrid,
    is_recurrent,
    takes_window_cache,
)
from ollama_spec.models.gguf_info import ModelInfo

# bytes per block, values per block (ggml's f16, q8_0 and q4_0)
KV_TYPES = {"f16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32)}
CTX_PAD = 256
STATE_BYTES = 4  # recurrent states are F32


def kv_cache_bytes(
    info: ModelInfo,
    n_ctx: int,
    kv_type: str = "f16",
    *,
    window_cache: bool = False,
    n_ubatch: int = 512,
    mtp: bool = False,
) -> int:
    """K and V caches of the attention layers for `n_ctx` tokens (padded to 256 cells, as llama.cpp does).

    `window_cache`: a sliding-window model's window layers get a cache of the window and one batch
    (llama-kv-cache-iswa.cpp), as the engine's target has; a draft keeps every position (runtime.py).
    A target's MTP (NextN) layers, the last blocks, are cached only with `mtp`: the target's context caches
    its trunk, and an MTP context the NextN layers, for as many cells (llama_model::create_memory).
    """
    block_bytes, block_values = KV_TYPES[kv_type]
    widths, full = layer_kv_widths(info), padded(n_ctx)
    short = window_cache_cells(info, n_ctx, n_ubatch) if window_cache else None
    cells = [short if short and in_window else full for in_window in window_layers(info)]
    cached = len(widths) - (0 if mtp else min(info.nextn_layers, len(widths)))
    return sum(c * w for c, w in zip(cells[:cached], widths[:cached])) * block_bytes // block_values


def window_cache_cells(info: ModelInfo, n_ctx: int, n_ubatch: int = 512) -> int | None:
    """The tokens a target's window layers cache (the window and a batch, padded), or None when it
    takes no window cache (architectures.takes_window_cache) or the context is no longer."""
    if not takes_window_cache(info.architecture) or not any(window_layers(info)):
        return None
    window = info.sliding_window or DEFAULT_WINDOWS.get(info.architecture, 0)
    cells = padded(window + n_ubatch) if window else None
    return cells if cells and cells < padded(n_ctx) else None


# Read from the vendored llama.cpp's src/models/<arch>.cpp: Gemma 2 and Llama 4 have a window
# without the key (4,096 and chunks of 8,192 tokens); Phi-3 has the key, but its window is off.
_WINDOW_BY_DEFAULT = frozenset({"gemma2", "llama4"})
_WINDOW_OFF = frozenset({"phi3"})


def has_sliding_window(info: ModelInfo) -> bool:
    """Does llama.cpp give this model a window cache beside the global one (Gemma 2 and 3,
    gpt-oss, Cohere 2, Llama 4, ...), full-size or not? Then its graph holds a second mask."""
    if info.architecture in _WINDOW_OFF:
        return False
    return info.architecture in _WINDOW_BY_DEFAULT or info.sliding_window is not None


def window_layers(info: ModelInfo) -> list[bool]:
    """Per layer, whether it attends over the window (llama.cpp's load_swa_pattern): the GGUF's
    pattern, a flag per layer or every n-th layer global, else the architecture's default n."""
    n_layer = _n_layer(info)
    pattern = info.metadata.get(f"{info.architecture}.attention.sliding_window_pattern")
    if isinstance(pattern, (tuple, list)):  # Ollama's converter writes one flag per layer
        return [bool(p) for p in pattern[:n_layer]] + [False] * (n_layer - len(pattern))
    n = (
        int(pattern)
        if isinstance(pattern, int) and not isinstance(pattern, bool)
        else WINDOW_CACHE_PATTERNS.get(info.architecture, 1)
    )
    return [n == 0 or i % n < n - 1 for i in range(n_layer)]


def recurrent_state_bytes(info: ModelInfo) -> int:
    """The fixed state of the recurrent layers (one sequence), independent of the context."""
    layers = sum(recurrent_layers(info))
    if not layers:
        return 0
    width = _state_width(info)
    if not width:
        raise CorruptGGUF(
            f"{info.path}: its GGUF header lacks the state sizes of its recurrent layers ({info.architecture})"
        )
    return layers * width * STATE_BYTES


def layer_kv_widths(info: ModelInfo) -> list[int]:
    """Per layer, K + V values per token (0 for a layer without a KV cache)."""
    n_layer = _n_layer(info)
    attention = _attention_layers(info)
    if not any(attention):
        return [0] * n_layer
    heads_kv = _per_layer(info, "attention.head_count_kv", info.head_count or 0)
    k_len = info.head_dim
    if not k_len or not any(h for h, a in zip(heads_kv, attention) if a):
        raise CorruptGGUF(
            f"{info.path}: its GGUF header lacks the layer count or attention head sizes needed to size the KV cache"
        )
    v_len = int(_scalar(info, "attention.value_length") or k_len)
    return [h * (k_len + v_len) if a else 0 for h, a in zip(heads_kv, attention)]


def recurrent_layers(info: ModelInfo) -> list[bool]:
    """Per layer, whether it keeps a recurrent state."""
    n_layer, arch = _n_layer(info), info.architecture
    if is_recurrent(arch):
        return [True] * n_layer
    if not is_hybrid(arch):
        return [False] * n_layer
    if arch == "falcon-h1":  # attention and SSM side by side in every layer
        return [True] * n_layer
    if arch in ("nemotron_h", "nemotron_h_moe"):  # layers with a feed-forward are neither
        heads_kv, ff = _per_layer(info, "attention.head_count_kv", 0), _per_layer(info, "feed_forward_length", 0)
        return [h == 0 and f == 0 for h, f in zip(heads_kv, ff)]
    listed = info.metadata.get(f"{arch}.attention.recurrent_layers")
    if isinstance(listed, tuple) and len(listed) >= n_layer:
        return [bool(x) for x in listed[:n_layer]]
    if interval := _scalar(info, "full_attention_interval"):
        return [(i + 1) % int(interval) != 0 for i in range(n_layer)]
    return [h == 0 for h in _per_layer(info, "attention.head_count_kv", 0)]


def kv_type_problem(info: ModelInfo, kv_type: str) -> str | None:
    """Why llama.cpp cannot quantize this model's KV cache to `kv_type`, if it cannot."""
    block = KV_TYPES[kv_type][1]
    if block > 1 and any(_attention_layers(info)) and (info.head_dim or 0) % block:
        return (
            f"--kv-type {kv_type} needs attention heads whose size is a multiple of {block}, but "
            f"{info.name or info.path.name} has {info.head_dim}; use --kv-type f16"
        )
    return None


def check_cache_shape(info: ModelInfo) -> None:
    """Raise CorruptGGUF if the header cannot size this model's caches."""
    layer_kv_widths(info)
    recurrent_state_bytes(info)


def padded(n_ctx: int) -> int:
    return -(-n_ctx // CTX_PAD) * CTX_PAD


def _attention_layers(info: ModelInfo) -> list[bool]:
    arch = info.architecture
    if is_recurrent(arch):
        return [False] * _n_layer(info)
    if arch == "falcon-h1" or not is_hybrid(arch):
        return [True] * _n_layer(info)
    if arch in ("nemotron_h", "nemotron_h_moe"):
        heads_kv, ff = _per_layer(info, "attention.head_count_kv", 0), _per_layer(info, "feed_forward_length", 0)
        return [h > 0 and f == 0 for h, f in zip(heads_kv, ff)]
    return [not r for r in recurrent_layers(info)]


def _state_width(info: ModelInfo) -> int:
    """llama.cpp's n_embd_r() + n_embd_s(): conv/shift state plus the SSM/WKV state, per layer."""
    d = info.embedding_length or 0
    if wkv := _scalar(info, "wkv.head_size"):  # RWKV: token shift + WKV state
        return int(_scalar(info, "token_shift_count") or 2) * d + d * int(wkv)
    if l_cache := _scalar(info, "shortconv.l_cache"):  # LFM2's short convolutions
        return d * (int(l_cache) - 1)
    conv = int(_scalar(info, "ssm.conv_kernel") or 0)
    if kda := _scalar(info, "kda.head_dim"):  # Kimi delta attention
        heads = info.head_count or 0
        return 3 * (conv - 1 if conv else 3) * heads * int(kda) + int(kda) ** 2 * heads
    inner, state = int(_scalar(info, "ssm.inner_size") or 0), int(_scalar(info, "ssm.state_size") or 0)
    groups = int(_scalar(info, "ssm.group_count") or 0)
    return max(conv - 1, 0) * (inner + 2 * groups * state) + state * inner  # Mamba's conv and SSM states


def _n_layer(info: ModelInfo) -> int:
    if not info.block_count:
        raise CorruptGGUF(f"{info.path}: its GGUF header lacks the layer count needed to size the KV cache")
    return info.block_count


def _per_layer(info: ModelInfo, key: str, default: int) -> list[int]:
    """A per-layer value that GGUF stores as one number or as one per layer."""
    n_layer = _n_layer(info)
    value = info.metadata.get(f"{info.architecture}.{key}")
    if isinstance(value, tuple):
        return [int(v) for v in value[:n_layer]] + [default] * (n_layer - len(value))
    return [int(value) if isinstance(value, (int, float)) else default] * n_layer


def _scalar(info: ModelInfo, key: str) -> float | None:
    value = info.metadata.get(f"{info.architecture}.{key}")
    if isinstance(value, tuple):
        return max(value) if value else None
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
