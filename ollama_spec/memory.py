"""Will the target, the draft and their KV caches fit, and what to change if they don't.

Sizes come from GGUF headers only, with llama.cpp's own rules:
- weights: under full offload every tensor goes to the GPU except `token_embd`, which llama.cpp
  always keeps on the CPU; a model with tied embeddings gets a GPU copy of it as its output matrix.
- KV cache: layers x context x (K + V width) x element size; the context is padded to 256 cells.
- compute buffer: what ggml's allocator reserves for the worst-case ubatch of T = min(ctx, 512)
  tokens with flash attention (llama.cpp's `auto` picks it on CUDA, Metal and CPU). Its peak is
  either inside a layer (the f16 attention mask, 3 ff-wide and 4 embedding-wide activations) or
  at the output (T x vocab logits): T x 4 x max(3 ff + 4 embd + ctx/2, vocab + 2 embd), measured
  against llama.cpp's logged sizes in tests/test_memory.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from .devices import Device, discover_devices
from .errors import CorruptGGUF, InsufficientMemory, InvalidSetting
from .gguf_info import ModelInfo, format_bytes

# bytes per block, values per block (ggml's f16, q8_0 and q4_0)
KV_TYPES = {"f16": (2, 1), "q8_0": (34, 32), "q4_0": (18, 32)}
N_UBATCH = 512  # llama.cpp's default n_ubatch, and runtime.LoadSettings' n_batch
CTX_PAD = 256
OUTPUT_ROWS = 16  # logits rows the speculative loop reads per step (K + 1), kept in RAM
FULL_OFFLOAD, PARTIAL_OFFLOAD, CPU_ONLY, DOES_NOT_FIT = "full_offload", "partial_offload", "cpu_only", "does_not_fit"


@dataclass(frozen=True)
class ModelNeeds:
    """What one model needs at one context size; bytes."""

    name: str
    n_layer: int
    weights: int  # on the GPU under full offload
    host_weights: int  # token embeddings: in RAM even under full offload
    file_weights: int  # every tensor, as a CPU-only load maps them
    kv: int
    compute: int
    host_compute: int  # llama.cpp's host-side compute buffer when the model is on a GPU
    output_buffer: int
    layer_weights: tuple[int, ...]
    output_weights: int
    largest_layer_tensor: int

    @property
    def gpu_total(self) -> int:
        return self.weights + self.kv + self.compute

    @property
    def cpu_total(self) -> int:
        return self.file_weights + self.kv + self.compute + self.output_buffer

    def split(self, n_gpu_layers: int, n_gpus: int) -> tuple[int, int]:
        """(GPU bytes, RAM bytes) with llama.cpp's n_gpu_layers: the output layer, then the last layers."""
        if n_gpu_layers > self.n_layer:
            gpu = self.gpu_total + self.compute * (n_gpus - 1)  # each GPU reserves its own compute buffer
            return gpu, self.host_weights + self.host_compute + self.output_buffer
        n_gpu_layers = max(n_gpu_layers, 0)
        on_gpu = range(self.n_layer - max(n_gpu_layers - 1, 0), self.n_layer)
        gpu_layers = sum(self.layer_weights[i] for i in on_gpu) + self.kv // self.n_layer * len(on_gpu)
        output = self.output_weights if n_gpu_layers else 0
        # Layers on the CPU need a CPU compute buffer, and for big batches llama.cpp copies their
        # weights to the GPU one matrix at a time (op offload): room for the largest one.
        gpu = gpu_layers + output + self.compute * n_gpus + self.largest_layer_tensor
        cpu_layers = sum(self.layer_weights) + self.kv - gpu_layers
        host = self.host_weights + cpu_layers + self.output_weights - output + self.compute + self.output_buffer
        return gpu, host

    def to_json(self) -> dict:
        return {"name": self.name, "layers": self.n_layer, "weights": self.weights,
                "host_weights": self.host_weights, "file_weights": self.file_weights, "kv_cache": self.kv,
                "compute": self.compute, "gpu_total": self.gpu_total, "cpu_total": self.cpu_total}


@dataclass(frozen=True)
class MemoryPlan:
    """The verdict for one target (+ draft) at one context size on a set of devices."""

    n_ctx: int
    kv_type: str
    target: ModelNeeds
    draft: ModelNeeds | None
    devices: tuple[Device, ...]
    verdict: str
    gpu_layers: int | None  # the target's n_gpu_layers (-1: all); None without a GPU
    gpu_bytes: int
    host_bytes: int
    suggestions: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def fits(self) -> bool:
        return self.verdict != DOES_NOT_FIT

    @property
    def target_layer_count(self) -> int:
        """Layers as llama.cpp counts them for n_gpu_layers: the repeating ones plus the output."""
        return self.target.n_layer + 1

    @property
    def gpus(self) -> tuple[Device, ...]:
        return tuple(d for d in self.devices if d.is_gpu)

    @property
    def host(self) -> Device | None:
        return next((d for d in self.devices if d.kind == "cpu"), None)

    @property
    def summary(self) -> str:
        """One line: the verdict with the numbers behind it."""
        gpu_free = format_bytes(sum(d.usable for d in self.gpus))
        ram_free = format_bytes(self.host.usable) if self.host else "unknown"
        need = format_bytes(self.gpu_bytes)
        if self.verdict == FULL_OFFLOAD:
            return f"fits with full offload: {need} of {gpu_free} usable GPU memory"
        if self.verdict == PARTIAL_OFFLOAD:
            draft = "; the draft stays fully on the GPU" if self.draft else ""
            return (f"fits only with {self.gpu_layers} of {self.target_layer_count} target layers on the GPU "
                    f"(n_gpu_layers={self.gpu_layers}): {need} on the GPU, {format_bytes(self.host_bytes)} in RAM"
                    f"{draft}")
        if self.verdict == CPU_ONLY:
            return f"fits in CPU RAM: {format_bytes(self.host_bytes)} of {ram_free} available (no GPU used)"
        if not self.gpus:
            return f"does not fit: needs {format_bytes(self.host_bytes)} of RAM, {ram_free} available"
        pair = "target and draft need" if self.draft else "the target needs"
        ram = f" and no layer split fits in {ram_free} of RAM" if self.host else " and no layer split fits"
        return f"does not fit: {pair} {need} of GPU memory with full offload, {gpu_free} usable,{ram}"

    def to_json(self) -> dict:
        """A JSON-ready dict (bytes as integers)."""
        return {
            "n_ctx": self.n_ctx, "kv_type": self.kv_type, "verdict": self.verdict, "fits": self.fits,
            "summary": self.summary, "gpu_layers": self.gpu_layers, "target_layer_count": self.target_layer_count,
            "gpu_bytes": self.gpu_bytes, "host_bytes": self.host_bytes,
            "target": self.target.to_json(), "draft": self.draft.to_json() if self.draft else None,
            "devices": [d.to_json() for d in self.devices],
            "suggestions": list(self.suggestions), "warnings": list(self.warnings),
        }


def kv_cache_bytes(info: ModelInfo, n_ctx: int, kv_type: str = "f16") -> int:
    """K and V caches for `n_ctx` tokens (padded to 256 cells, as llama.cpp does)."""
    block_bytes, block_values = KV_TYPES[kv_type]
    _kv_shape(info)  # the layers may differ: sum their KV heads
    return _padded(n_ctx) * info.kv_head_total * (info.head_dim + info.head_dim_v) * block_bytes // block_values


def model_needs(info: ModelInfo, n_ctx: int, kv_type: str = "f16") -> ModelNeeds:
    """Weights, KV cache and compute buffers of one model at one context size."""
    n_layer, *_ = _kv_shape(info)
    d, ff, vocab = info.embedding_length, info.feed_forward_length, info.vocab_size
    if not d or not ff or not vocab:
        raise CorruptGGUF(f"{info.path}: its GGUF header lacks the embedding, feed-forward or vocabulary size")
    layers = [0] * n_layer
    largest = host = output = 0
    for tensor in info.tensors:
        parts = tensor.name.split(".")
        if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < n_layer:
            layers[int(parts[1])] += tensor.n_bytes
            largest = max(largest, tensor.n_bytes)
        elif tensor.name == "token_embd.weight":
            host += tensor.n_bytes
        else:
            output += tensor.n_bytes
    if not any(t.name == "output.weight" for t in info.tensors):
        output += host  # tied embeddings: llama.cpp duplicates token_embd as the GPU output matrix
    ctx, tokens = _padded(n_ctx), min(_padded(n_ctx), N_UBATCH)
    compute = tokens * 4 * max(3 * ff + 4 * d + ctx // 2, vocab + 2 * d)
    return ModelNeeds(
        name=info.name or info.path.name, n_layer=n_layer, weights=sum(layers) + output, host_weights=host,
        file_weights=info.tensor_bytes, kv=kv_cache_bytes(info, n_ctx, kv_type), compute=compute,
        host_compute=tokens * 4 * d * 2 + ctx * tokens * 2, output_buffer=vocab * 4 * OUTPUT_ROWS,
        layer_weights=tuple(layers), output_weights=output, largest_layer_tensor=largest,
    )


def plan_memory(target_info: ModelInfo, draft_info: ModelInfo | None, n_ctx: int, kv_type: str = "f16",
                devices: Sequence[Device] | None = None) -> MemoryPlan:
    """Plan where the target (and draft) go; `devices` defaults to this machine's (GPUs, then RAM)."""
    models = [m for m in (target_info, draft_info) if m is not None]
    _check_settings(models, n_ctx, kv_type)
    notes: list[str] = []
    if devices is None:
        devices, notes = discover_devices()
    devices = tuple(devices)
    if not devices:
        raise InvalidSetting("no devices to plan for: give at least one GPU or the CPU RAM")
    warnings = [
        f"--ctx {n_ctx} is larger than {m.name or m.path.name}'s trained context ({m.context_length} tokens); "
        "output quality may drop past it"
        for m in models if m.context_length and n_ctx > m.context_length
    ]
    plan = _plan(target_info, draft_info, n_ctx, kv_type, devices)
    suggestions = () if plan.verdict in (FULL_OFFLOAD, CPU_ONLY) else _suggestions(plan, target_info, draft_info)
    return replace(plan, suggestions=suggestions, warnings=tuple(warnings + notes))


def ensure_fits(plan: MemoryPlan) -> None:
    """Raise InsufficientMemory (verdict + what to change) unless the plan fits, split or not."""
    if plan.fits:
        return
    advice = "; or ".join(plan.suggestions)
    raise InsufficientMemory(f"{plan.summary}" + (f"; {advice}" if advice else ""))


def _plan(target_info: ModelInfo, draft_info: ModelInfo | None, n_ctx: int, kv_type: str,
          devices: tuple[Device, ...]) -> MemoryPlan:
    target = model_needs(target_info, n_ctx, kv_type)
    draft = model_needs(draft_info, n_ctx, kv_type) if draft_info is not None else None
    gpus = [d for d in devices if d.is_gpu]
    host = next((d for d in devices if d.kind == "cpu"), None)
    host_free = host.usable if host else None  # no RAM given: only the GPU is checked

    def plan(verdict: str, gpu_layers: int | None, gpu_bytes: int, host_bytes: int) -> MemoryPlan:
        return MemoryPlan(n_ctx, kv_type, target, draft, devices, verdict, gpu_layers, gpu_bytes, host_bytes, (), ())

    if not gpus:
        need = target.cpu_total + (draft.cpu_total if draft else 0)
        return plan(CPU_ONLY if host_free is None or need <= host_free else DOES_NOT_FIT, None, 0, need)
    budget = sum(d.usable for d in gpus)
    # The draft runs K times per step, so it gets the GPU first; the target gets what is left.
    draft_gpu = draft.gpu_total + draft.compute * (len(gpus) - 1) if draft else 0
    draft_host = draft.host_weights + draft.host_compute + draft.output_buffer if draft else 0
    full_gpu = draft_gpu + target.gpu_total + target.compute * (len(gpus) - 1)
    for n_gpu_layers in range(target.n_layer + 1, -1, -1):
        gpu, host_bytes = target.split(n_gpu_layers, len(gpus))
        if draft_gpu + gpu <= budget and (host_free is None or draft_host + host_bytes <= host_free):
            if n_gpu_layers > target.n_layer:
                return plan(FULL_OFFLOAD, -1, draft_gpu + gpu, draft_host + host_bytes)
            return plan(PARTIAL_OFFLOAD, n_gpu_layers, draft_gpu + gpu, draft_host + host_bytes)
    return plan(DOES_NOT_FIT, None, full_gpu, draft_host + target.split(0, len(gpus))[1])


def _suggestions(plan: MemoryPlan, target_info: ModelInfo, draft_info: ModelInfo | None) -> tuple[str, ...]:
    goal = CPU_ONLY if not plan.gpus else FULL_OFFLOAD
    where = "in RAM" if goal == CPU_ONLY else "with full offload"
    suggestions = []

    def verdict(n_ctx: int, kv_type: str) -> MemoryPlan:
        return _plan(target_info, draft_info, n_ctx, kv_type, plan.devices)

    low, high = 0, plan.n_ctx // CTX_PAD  # the largest multiple of 256 that reaches the goal
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if verdict(mid * CTX_PAD, plan.kv_type).verdict == goal else (low, mid - 1)
    if low and low * CTX_PAD < plan.n_ctx:
        suggestions.append(f"--ctx {low * CTX_PAD} fits {where}")
    for kv_type in _smaller_kv_types(plan.kv_type, [m for m in (target_info, draft_info) if m]):
        other = verdict(plan.n_ctx, kv_type)
        kv = format_bytes(other.target.kv + (other.draft.kv if other.draft else 0))
        if other.verdict == goal:
            suggestions.append(f"--kv-type {kv_type} fits {where} (KV caches {kv})")
        elif other.verdict == PARTIAL_OFFLOAD and (plan.gpu_layers is None or other.gpu_layers > plan.gpu_layers):
            suggestions.append(f"--kv-type {kv_type} puts {other.gpu_layers} of {plan.target_layer_count} "
                               f"target layers on the GPU (KV caches {kv})")
    if plan.verdict == PARTIAL_OFFLOAD:
        suggestions.append(f"keep --ctx {plan.n_ctx} with n_gpu_layers={plan.gpu_layers} "
                           "(the other target layers run on the CPU, several times slower)")
    if not suggestions:
        suggestions.append("use a smaller quantization of the target, a smaller draft, or a machine with more memory")
    return tuple(suggestions)


def _smaller_kv_types(kv_type: str, models: list[ModelInfo]) -> list[str]:
    size = KV_TYPES[kv_type][0] / KV_TYPES[kv_type][1]
    return [name for name, (b, v) in KV_TYPES.items()
            if b / v < size and all(_kv_type_problem(m, name) is None for m in models)]


def _kv_type_problem(info: ModelInfo, kv_type: str) -> str | None:
    block = KV_TYPES[kv_type][1]
    if block > 1 and (info.head_dim or 0) % block:
        return (f"--kv-type {kv_type} needs attention heads whose size is a multiple of {block}, but "
                f"{info.name or info.path.name} has {info.head_dim}; use --kv-type f16")
    return None


def _check_settings(models: list[ModelInfo], n_ctx: int, kv_type: str) -> None:
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx <= 0:
        raise InvalidSetting(f"--ctx must be a positive number of tokens, got {n_ctx}")
    if kv_type not in KV_TYPES:
        raise InvalidSetting(f"unknown KV cache type {kv_type!r}: use one of {', '.join(KV_TYPES)}")
    for info in models:
        _kv_shape(info)
        if problem := _kv_type_problem(info, kv_type):
            raise InvalidSetting(problem)


def _kv_shape(info: ModelInfo) -> tuple[int, int, int]:
    """(layers, K width, V width) of the KV cache."""
    if not info.block_count or not info.head_count_kv or not info.head_dim:
        raise CorruptGGUF(f"{info.path}: its GGUF header lacks the layer count or attention head sizes "
                          "needed to size the KV cache")
    return info.block_count, info.head_dim * info.head_count_kv, info.head_dim_v * info.head_count_kv


def _padded(n_ctx: int) -> int:
    return -(-n_ctx // CTX_PAD) * CTX_PAD
