"""What one model needs at one context size, from its GGUF header only, by llama.cpp's own rules:
- weights: under full offload every tensor goes to the GPU except `token_embd`, which llama.cpp
  always keeps on the CPU; a model with tied embeddings gets a GPU copy of it as its output matrix.
  Where weights stay on the CPU, llama.cpp may also keep a repacked copy of them (repack.py).
- caches: kv_cache.py (a per-token KV cache for attention layers, a fixed recurrent state for
  Mamba/RWKV layers); the context is padded to 256 cells.
- compute buffer: what ggml's allocator reserves for the worst-case ubatch of T = min(ctx, 512)
  tokens with flash attention (llama.cpp's `auto` picks it on CUDA, Metal and CPU). Its peak is
  either inside a layer (the f16 attention mask, 3 ff-wide and 4 embedding-wide activations) or
  at the output (T x vocab logits): T x 4 x max(3 ff + 4 embd + ctx/2, vocab + 2 embd), measured
  against llama.cpp's logged sizes in tests/planning/test_memory.py.
- MTP (NextN) layers, the last blocks of some targets: llama.cpp skips their tensors and leaves them out of
  the target's cache unless they draft (`mtp`); then they load with the target, and their MTP context
  holds their own cache, a compute buffer for a batch of the target's and its logits, and the target
  keeps its final state for every row of a batch (`mtp_needs`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ollama_spec.errors import CorruptGGUF
from ollama_spec.models.gguf_info import ModelInfo
from ollama_spec.planning.kv_cache import (
    check_cache_shape,
    has_sliding_window,
    kv_cache_bytes,
    layer_kv_widths,
    padded,
    recurrent_layers,
    recurrent_state_bytes,
    window_cache_cells,
)
from ollama_spec.planning.repack import repacked_bytes

N_UBATCH = 512  # llama.cpp's default n_ubatch, and runtime.LoadSettings' n_batch
OUTPUT_ROWS = 16  # logits rows the speculative loop reads per step (K + 1), kept in RAM


def mtp_needs(info: ModelInfo, n_ctx: int, compute_width: int) -> tuple[int, int]:
    """(compute, host) bytes the MTP context adds beside its target: a compute buffer for a target's batch
    and the pending row (as wide as the target's, `compute_width` values a row), and in RAM the target's
    final state kept for every row of a batch, the context's own state for each row it reads, and its
    logits."""
    tokens = min(padded(n_ctx), N_UBATCH + 1)
    rows = 4 * (info.embedding_length or 0) * (N_UBATCH + tokens)
    return tokens * 4 * compute_width, rows + info.vocab_size * 4 * OUTPUT_ROWS


def captured_rows_bytes(info: ModelInfo) -> int:
    """What an EAGLE-3 head makes its target keep in RAM: the inputs of the head's 3 target layers for
    every token of a batch (llama.cpp's layer-input buffers, f32); 0 for any other model."""
    if info.architecture != "eagle3":
        return 0
    return 3 * int(info.metadata.get("eagle3.target_hidden_size") or 0) * N_UBATCH * 4


@dataclass(frozen=True)
class ModelNeeds:
    """What one model needs at one context size; bytes."""

    name: str
    n_layer: int
    weights: int  # on the GPU under full offload
    host_weights: int  # token embeddings: in RAM even under full offload
    file_weights: int  # every tensor, as a CPU-only load maps them
    kv: int  # the KV cache of the attention layers plus the recurrent state (`recurrent`) of the others
    compute: int
    host_compute: int  # llama.cpp's host-side compute buffer when the model is on a GPU
    output_buffer: int
    layer_weights: tuple[int, ...]
    output_weights: int
    largest_layer_tensor: int
    # llama.cpp's repacked second copy (AMX, CPU_REPACK) of the matrices kept on the CPU
    layer_repacked: tuple[int, ...] = ()
    output_repacked: int = 0
    recurrent: int = 0
    window_cells: int = 0  # a sliding-window target's window layers cache this many tokens, not the context

    @property
    def repacked(self) -> int:
        """The repacked copy of every layer and the output, when the whole model is on the CPU."""
        return sum(self.layer_repacked) + self.output_repacked

    @property
    def gpu_total(self) -> int:
        return self.weights + self.kv + self.compute

    @property
    def cpu_total(self) -> int:
        return self.file_weights + self.repacked + self.kv + self.compute + self.output_buffer

    def split(self, n_gpu_layers: int, n_gpus: int) -> tuple[int, int]:
        """(GPU bytes, RAM bytes) with llama.cpp's n_gpu_layers (placement: gpu_weights)."""
        if n_gpu_layers > self.n_layer:
            gpu = self.gpu_total + self.compute * (n_gpus - 1)  # each GPU reserves its own compute buffer
            return gpu, self.host_weights + self.host_compute + self.output_buffer
        n_gpu_layers = max(n_gpu_layers, 0)
        gpu_kv = self.kv // self.n_layer * max(n_gpu_layers - 1, 0)
        gpu_weights = self.gpu_weights(n_gpu_layers)
        # Layers on the CPU need a CPU compute buffer, and for big batches llama.cpp copies their
        # weights to the GPU one matrix at a time (op offload): room for the largest one.
        gpu = gpu_weights + gpu_kv + self.compute * n_gpus + self.largest_layer_tensor
        host = (
            self.host_weights
            + sum(self.layer_weights)
            + self.output_weights
            - gpu_weights
            + self.kv
            - gpu_kv
            + self.cpu_repacked(n_gpu_layers)
            + self.compute
            + self.output_buffer
        )
        return gpu, host

    def gpu_weights(self, n_gpu_layers: int) -> int:
        """Weights on the GPU with this n_gpu_layers, placed as llama.cpp's load_tensors does: layer
        il (0..n_layer, n_layer being the output layer) goes to the GPU when il >= n_layer + 1 -
        n_gpu_layers. So 1 offloads the output layer alone, and each more adds the last repeating layer
        still on the CPU; token_embd never moves."""
        n_gpu_layers = min(max(n_gpu_layers, 0), self.n_layer + 1)
        repeating = self.layer_weights[self.n_layer - max(n_gpu_layers - 1, 0) :]
        return sum(repeating) + (self.output_weights if n_gpu_layers else 0)

    def cpu_repacked(self, n_gpu_layers: int) -> int:
        """The repacked copy of what stays on the CPU with this n_gpu_layers (see split)."""
        if n_gpu_layers > self.n_layer:
            return 0
        n_cpu_layers = self.n_layer - max(n_gpu_layers - 1, 0)
        return sum(self.layer_repacked[:n_cpu_layers]) + (0 if n_gpu_layers > 0 else self.output_repacked)

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "layers": self.n_layer,
            "weights": self.weights,
            "host_weights": self.host_weights,
            "file_weights": self.file_weights,
            "kv_cache": self.kv,
            "compute": self.compute,
            "repacked": self.repacked,
            "gpu_total": self.gpu_total,
            "cpu_total": self.cpu_total,
            **({"window_cells": self.window_cells} if self.window_cells else {}),
        }


def _shape(info: ModelInfo) -> tuple[int, int, int, bool, bool]:
    """The embedding, feed-forward and vocabulary sizes, and whether the model has attention and
    recurrent layers; CorruptGGUF where the header lacks a size."""
    d, vocab = info.embedding_length, info.vocab_size
    attention, recurrent = any(layer_kv_widths(info)), any(recurrent_layers(info))
    ff = info.feed_forward_length or (0 if attention else 1)  # Mamba and RWKV have no feed-forward size
    if not d or not ff or not vocab:
        raise CorruptGGUF(f"{info.path}: its GGUF header lacks the embedding, feed-forward or vocabulary size")
    return d, ff, vocab, attention, recurrent


def _weights(info: ModelInfo, loaded: int, repack_features: frozenset[str]):
    """Where the weights go: each of the first `loaded` blocks' bytes and repacked copy, the largest layer
    tensor, token_embd (host), the output's bytes and repacked copy, and the skipped blocks' bytes (a
    target's MTP layers where they do not draft: llama.cpp does not load them)."""
    n_layer = info.block_count
    layers, repacked = [0] * n_layer, [0] * n_layer
    largest = host = output = output_repacked = skipped = 0
    tied = not any(t.name == "output.weight" for t in info.tensors)
    for tensor in info.tensors:
        parts = tensor.name.split(".")
        block = int(parts[1]) if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() else None
        if block is not None and loaded <= block < n_layer:
            skipped += tensor.n_bytes
        elif block is not None and block < n_layer:
            layers[block] += tensor.n_bytes
            repacked[block] += repacked_bytes(tensor, repack_features)
            largest = max(largest, tensor.n_bytes)
        elif tensor.name == "token_embd.weight":
            host += tensor.n_bytes
            # tied embeddings: llama.cpp loads token_embd again as the output matrix (and may repack that)
            output_repacked += repacked_bytes(tensor, repack_features, as_output=True) if tied else 0
        else:
            output += tensor.n_bytes
            output_repacked += repacked_bytes(tensor, repack_features)
    if tied:
        output += host  # llama.cpp duplicates token_embd as the GPU output matrix
    return layers, repacked, largest, host, output, output_repacked, skipped


def _compute_widths(
    info: ModelInfo, ff: int, ctx: int, attention: bool, recurrent: bool, flash_attention: bool
) -> list[int]:
    """The widths (f32 values a row) of what a batch's graph holds at once, per part: inside an attention
    layer, inside a recurrent one, at the output, and without flash attention the scores; the compute
    buffer is the widest of them."""
    d, vocab = info.embedding_length, info.vocab_size
    # Attention layers: the f16 mask and ff-/embedding-wide activations. Recurrent layers: about
    # 7 SSM-inner-wide activations (13.3 x embd measured on Mamba); their logits take 3 embd more.
    inner = int(info.metadata.get(f"{info.architecture}.ssm.inner_size") or 2 * d)
    # A sliding-window model's graph holds two masks, the global layers' and the window layers'.
    masks = 2 if has_sliding_window(info) else 1
    widths = [
        3 * ff + 4 * d + masks * ctx // 2 if attention else 0,
        7 * inner if recurrent else 0,
        vocab + (3 if recurrent else 2) * d,
    ]
    if attention and not flash_attention:
        # Without flash attention the f32 scores of every head and f32 masks are materialised
        # (fitted to llama.cpp's logged buffers on the synthetic models: within 3 %, over not under).
        widths.append(
            ((info.head_count or 0) + masks) * ctx + 5 * d + 2 * (info.head_count_kv or 0) * (info.head_dim or 0) + 8
        )
    return widths


def model_needs(
    info: ModelInfo,
    n_ctx: int,
    kv_type: str = "f16",
    repack_features: frozenset[str] = frozenset(),
    *,
    flash_attention: bool = True,
    window_cache: bool = False,
    mtp: bool = False,
) -> ModelNeeds:
    """Weights, KV cache and compute buffers of one model at one context size.

    `repack_features`: llama.cpp's CPU features when its extra buffers are in use (repack.py);
    empty when they are off or the CPU layers' weights cannot go there. `window_cache`: loaded as
    the engine loads a target, a sliding-window model's window layers cache only the window. `mtp`: the
    target's MTP (NextN) layers draft for it (without, llama.cpp does not load them).
    """
    check_cache_shape(info)
    n_layer = info.block_count
    d, ff, vocab, attention, recurrent = _shape(info)
    loaded = n_layer if mtp else n_layer - min(info.nextn_layers, n_layer)  # the blocks llama.cpp loads
    layers, repacked, largest, host, output, output_repacked, skipped = _weights(info, loaded, repack_features)
    ctx, tokens = padded(n_ctx), min(padded(n_ctx), N_UBATCH)
    widths = _compute_widths(info, ff, ctx, attention, recurrent, flash_attention)
    compute = tokens * 4 * max(widths)
    # the MTP context takes llama.cpp's `auto` flash attention, on with every backend here
    mtp_compute, mtp_host = mtp_needs(info, n_ctx, max(widths[:3])) if mtp and info.nextn_layers else (0, 0)
    state = recurrent_state_bytes(info)
    kv = kv_cache_bytes(info, n_ctx, kv_type, window_cache=window_cache, n_ubatch=N_UBATCH, mtp=mtp)
    window_cells = (window_cache_cells(info, n_ctx, N_UBATCH) or 0) if window_cache else 0
    return ModelNeeds(
        name=info.name or info.path.name,
        n_layer=n_layer,
        weights=sum(layers) + output,
        host_weights=host,
        file_weights=info.tensor_bytes - skipped,
        kv=kv + state,
        recurrent=state,
        window_cells=window_cells,
        compute=compute + mtp_compute,
        host_compute=tokens * 4 * d * 2 + ctx * tokens * 2,
        output_buffer=vocab * 4 * OUTPUT_ROWS + captured_rows_bytes(info) + mtp_host,
        layer_weights=tuple(layers),
        output_weights=output,
        largest_layer_tensor=largest,
        layer_repacked=tuple(repacked),
        output_repacked=output_repacked,
    )
