"""Will the target, the draft and their KV caches fit, and what to change if they don't.

Sizes come from GGUF headers only, with llama.cpp's own rules:
- weights: under full offload every tensor goes to the GPU except `token_embd`, which llama.cpp
  always keeps on the CPU; a model with tied embeddings gets a GPU copy of it as its output matrix.
  Where weights stay on the CPU, llama.cpp may also keep a repacked copy of them (repack.py).
- caches: kv_cache.py (a per-token KV cache for attention layers, a fixed recurrent state for
  Mamba/RWKV layers); the context is padded to 256 cells.
- compute buffer: what ggml's allocator reserves for the worst-case ubatch of T = min(ctx, 512)
  tokens with flash attention (llama.cpp's `auto` picks it on CUDA, Metal and CPU). Its peak is
  either inside a layer (the f16 attention mask, 3 ff-wide and 4 embedding-wide activations) or
  at the output (T x vocab logits): T x 4 x max(3 ff + 4 embd + ctx/2, vocab + 2 embd), measured
  against llama.cpp's logged sizes in tests/test_memory.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ollama_spec.planning.devices import CPU_PLAN_NOTE, Device, discover_devices
from ollama_spec.errors import CorruptGGUF, InsufficientMemory, InvalidSetting
from ollama_spec.models.gguf_info import ModelInfo, format_bytes
from ollama_spec.planning.kv_cache import (
    CTX_PAD,
    KV_TYPES,
    check_cache_shape,
    has_sliding_window,
    kv_cache_bytes,
    kv_type_problem,
    layer_kv_widths,
    padded,
    recurrent_layers,
    recurrent_state_bytes,
    window_cache_cells,
)
from ollama_spec.planning.repack import cpu_features, repacked_bytes

N_UBATCH = 512  # llama.cpp's default n_ubatch, and runtime.LoadSettings' n_batch
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
        host = (self.host_weights + sum(self.layer_weights) + self.output_weights - gpu_weights + self.kv - gpu_kv
                + self.cpu_repacked(n_gpu_layers) + self.compute + self.output_buffer)
        return gpu, host

    def gpu_weights(self, n_gpu_layers: int) -> int:
        """Weights on the GPU with this n_gpu_layers, placed as llama.cpp's load_tensors does: layer
        il (0..n_layer, n_layer being the output layer) goes to the GPU when il >= n_layer + 1 -
        n_gpu_layers. So 1 offloads the output layer alone, and each more adds the last repeating layer
        still on the CPU; token_embd never moves."""
        n_gpu_layers = min(max(n_gpu_layers, 0), self.n_layer + 1)
        repeating = self.layer_weights[self.n_layer - max(n_gpu_layers - 1, 0):]
        return sum(repeating) + (self.output_weights if n_gpu_layers else 0)

    def cpu_repacked(self, n_gpu_layers: int) -> int:
        """The repacked copy of what stays on the CPU with this n_gpu_layers (see split)."""
        if n_gpu_layers > self.n_layer:
            return 0
        n_cpu_layers = self.n_layer - max(n_gpu_layers - 1, 0)
        return sum(self.layer_repacked[:n_cpu_layers]) + (0 if n_gpu_layers > 0 else self.output_repacked)

    def to_json(self) -> dict:
        return {"name": self.name, "layers": self.n_layer, "weights": self.weights,
                "host_weights": self.host_weights, "file_weights": self.file_weights, "kv_cache": self.kv,
                "compute": self.compute, "repacked": self.repacked, "gpu_total": self.gpu_total,
                "cpu_total": self.cpu_total, **({"window_cells": self.window_cells} if self.window_cells else {})}


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
    repack: bool = True  # llama.cpp's extra CPU buffers are on (use_extra_bufts)
    host_repacked: int = 0  # of host_bytes: the repacked copy of weights kept on the CPU
    flash_attention: bool = True  # planned with llama.cpp's flash attention (its default, auto, picks it)
    # with several GPUs or RPC servers: each one's bytes (as `gpus` orders them) and share of the target
    device_bytes: tuple[int, ...] = ()
    tensor_split: tuple[float, ...] = ()

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
    def local_gpus(self) -> tuple[Device, ...]:
        return tuple(d for d in self.gpus if not d.is_remote)

    @property
    def remote_devices(self) -> tuple[Device, ...]:
        return tuple(d for d in self.gpus if d.is_remote)

    @property
    def offload_word(self) -> str:
        """What the offload devices are called in messages."""
        if not self.remote_devices:
            return "GPU"
        return "GPUs and RPC servers" if self.local_gpus else "RPC servers"

    @property
    def offload_memory(self) -> str:
        return "GPU memory" if not self.remote_devices else f"memory on the {self.offload_word}"

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
            return f"fits with full offload: {need} of {gpu_free} usable {self.offload_memory}"
        if self.verdict == PARTIAL_OFFLOAD:
            draft = "; the draft stays fully on the GPU" if self.draft and self.local_gpus else ""
            return (f"fits only with {self.gpu_layers} of {self.target_layer_count} target layers on the "
                    f"{self.offload_word} (n_gpu_layers={self.gpu_layers}): {need} on the {self.offload_word}, "
                    f"{format_bytes(self.host_bytes)} in RAM"
                    f"{draft}")
        if self.verdict == CPU_ONLY:
            return f"fits in CPU RAM: {format_bytes(self.host_bytes)} of {ram_free} available (no GPU used)"
        if not self.gpus:
            return f"does not fit: needs {format_bytes(self.host_bytes)} of RAM, {ram_free} available"
        pair = "target and draft need" if self.draft else "the target needs"
        ram = f" and no layer split fits in {ram_free} of RAM" if self.host else " and no layer split fits"
        return f"does not fit: {pair} {need} of {self.offload_memory} with full offload, {gpu_free} usable,{ram}"

    def to_json(self) -> dict:
        """A JSON-ready dict (bytes as integers)."""
        return {
            "n_ctx": self.n_ctx, "kv_type": self.kv_type, "verdict": self.verdict, "fits": self.fits,
            "summary": self.summary, "gpu_layers": self.gpu_layers, "target_layer_count": self.target_layer_count,
            "gpu_bytes": self.gpu_bytes, "host_bytes": self.host_bytes,
            "target": self.target.to_json(), "draft": self.draft.to_json() if self.draft else None,
            "devices": [d.to_json() for d in self.devices],
            "suggestions": list(self.suggestions), "warnings": list(self.warnings),
            "repack": self.repack, "host_repacked": self.host_repacked,
            "tensor_split": list(self.tensor_split), "device_bytes": list(self.device_bytes),
        }


def model_needs(info: ModelInfo, n_ctx: int, kv_type: str = "f16",
                repack_features: frozenset[str] = frozenset(), *, flash_attention: bool = True,
                window_cache: bool = False) -> ModelNeeds:
    """Weights, KV cache and compute buffers of one model at one context size.

    `repack_features`: llama.cpp's CPU features when its extra buffers are in use (repack.py);
    empty when they are off or the CPU layers' weights cannot go there. `window_cache`: loaded as
    the engine loads a target, a sliding-window model's window layers cache only the window.
    """
    check_cache_shape(info)
    n_layer = info.block_count
    d, vocab = info.embedding_length, info.vocab_size
    attention, recurrent = any(layer_kv_widths(info)), any(recurrent_layers(info))
    ff = info.feed_forward_length or (0 if attention else 1)  # Mamba and RWKV have no feed-forward size
    if not d or not ff or not vocab:
        raise CorruptGGUF(f"{info.path}: its GGUF header lacks the embedding, feed-forward or vocabulary size")
    layers, repacked = [0] * n_layer, [0] * n_layer
    largest = host = output = output_repacked = 0
    tied = not any(t.name == "output.weight" for t in info.tensors)
    for tensor in info.tensors:
        parts = tensor.name.split(".")
        if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit() and int(parts[1]) < n_layer:
            layers[int(parts[1])] += tensor.n_bytes
            repacked[int(parts[1])] += repacked_bytes(tensor, repack_features)
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
    ctx, tokens = padded(n_ctx), min(padded(n_ctx), N_UBATCH)
    # Attention layers: the f16 mask and ff-/embedding-wide activations. Recurrent layers: about
    # 7 SSM-inner-wide activations (13.3 x embd measured on Mamba); their logits take 3 embd more.
    inner = int(info.metadata.get(f"{info.architecture}.ssm.inner_size") or 2 * d)
    # A sliding-window model's graph holds two masks, the global layers' and the window layers'.
    masks = 2 if has_sliding_window(info) else 1
    widths = [3 * ff + 4 * d + masks * ctx // 2 if attention else 0, 7 * inner if recurrent else 0,
              vocab + (3 if recurrent else 2) * d]
    if attention and not flash_attention:
        # Without flash attention the f32 scores of every head and f32 masks are materialised
        # (fitted to llama.cpp's logged buffers on the synthetic models: within 3 %, over not under).
        widths.append(((info.head_count or 0) + masks) * ctx + 5 * d
                      + 2 * (info.head_count_kv or 0) * (info.head_dim or 0) + 8)
    compute = tokens * 4 * max(widths)
    state = recurrent_state_bytes(info)
    kv = kv_cache_bytes(info, n_ctx, kv_type, window_cache=window_cache, n_ubatch=N_UBATCH)
    window_cells = (window_cache_cells(info, n_ctx, N_UBATCH) or 0) if window_cache else 0
    return ModelNeeds(
        name=info.name or info.path.name, n_layer=n_layer, weights=sum(layers) + output, host_weights=host,
        file_weights=info.tensor_bytes, kv=kv + state, recurrent=state,
        window_cells=window_cells,
        compute=compute,
        host_compute=tokens * 4 * d * 2 + ctx * tokens * 2, output_buffer=vocab * 4 * OUTPUT_ROWS,
        layer_weights=tuple(layers), output_weights=output, largest_layer_tensor=largest,
        layer_repacked=tuple(repacked), output_repacked=output_repacked,
    )


def plan_memory(target_info: ModelInfo, draft_info: ModelInfo | None, n_ctx: int, kv_type: str = "f16",
                devices: Sequence[Device] | None = None, *, repack: bool = True,
                features: frozenset[str] | None = None, flash_attention: bool | None = None,
                tensor_split: tuple[float, ...] = (), remote: Sequence[Device] = (),
                main_device: int | None = None) -> MemoryPlan:
    """Plan where the target (and draft) go; `devices` defaults to this machine's (GPUs, then RAM).

    `repack`: whether the models load with llama.cpp's extra CPU buffers (canary.decide_repack);
    then the repacked copy of CPU weights is counted, by what llama.cpp reports of this machine's
    CPU (`features`, repack.cpu_features()) unless other features are given. `flash_attention`
    None plans what "auto" does: on with a GPU, off where only the CPU runs the models.
    `tensor_split`: each offload device's share of the target (--tensor-split); () splits by the
    memory left once the draft is on this machine's GPUs, and the plan says that split.
    `remote`: RPC servers' devices (devices.rpc_device), before this machine's. `main_device`: with
    --split-mode none, the index of the one offload device that holds the target.
    """
    models = [m for m in (target_info, draft_info) if m is not None]
    _check_settings(models, n_ctx, kv_type)
    notes: list[str] = []
    if devices is None:
        devices, notes = discover_devices()
    if remote:  # the target is planned onto the servers: "no GPU here" is not the whole story
        notes = [note for note in notes if not note.endswith(CPU_PLAN_NOTE)]
    devices = (*remote, *devices)  # llama.cpp's order: RPC servers' devices first
    offload = [d for d in devices if d.is_gpu]
    if len(tensor_split) > len(offload):  # llama.cpp would ignore the extra shares without a word
        if not offload:
            raise InvalidSetting("--tensor-split: there is no GPU or RPC server to split the target over")
        count = "is 1 device" if len(offload) == 1 else f"are {len(offload)} devices"
        raise InvalidSetting(f"--tensor-split has {len(tensor_split)} shares but there {count} to offload to "
                             f"({', '.join(d.name for d in offload)}): give one share per device, RPC servers first")
    if main_device is not None:  # --split-mode none: the target on that one device
        if offload and not 0 <= main_device < len(offload):
            raise InvalidSetting(f"--main-gpu {main_device}: there are {len(offload)} devices to offload to "
                                 f"({', '.join(d.name for d in offload)}), numbered from 0")
        devices = tuple(d for d in devices if not d.is_gpu or d is offload[main_device])
    if not devices:
        raise InvalidSetting("no devices to plan for: give at least one GPU or the CPU RAM")
    warnings = [
        f"--ctx {n_ctx} is larger than {m.name or m.path.name}'s trained context ({m.context_length} tokens); "
        "output quality may drop past it"
        for m in models if m.context_length and n_ctx > m.context_length
    ]
    features = (cpu_features() if features is None else features) if repack else frozenset()
    if flash_attention is None:  # what runtime.choose_flash_attention picks: on with a GPU, off on the CPU
        flash_attention = kv_type != "f16" or any(d.is_gpu and not d.is_remote for d in devices)
    plan = _plan(target_info, draft_info, n_ctx, kv_type, devices, features, flash_attention, tensor_split)
    plan = replace(plan, repack=repack, flash_attention=flash_attention)
    done = plan.verdict in (FULL_OFFLOAD, CPU_ONLY)
    suggestions = () if done else _suggestions(plan, target_info, draft_info, features, tensor_split)
    return replace(plan, suggestions=suggestions, warnings=tuple(warnings + notes))


def ensure_fits(plan: MemoryPlan) -> None:
    """Raise InsufficientMemory (verdict + what to change) unless the plan fits, split or not."""
    if plan.fits:
        return
    advice = "; or ".join(plan.suggestions)
    raise InsufficientMemory(f"{plan.summary}" + (f"; {advice}" if advice else ""))


def _plan(target_info: ModelInfo, draft_info: ModelInfo | None, n_ctx: int, kv_type: str,
          devices: tuple[Device, ...], features: frozenset[str], flash_attention: bool = True,
          tensor_split: tuple[float, ...] = ()) -> MemoryPlan:
    gpus = [d for d in devices if d.is_gpu]
    # Beside a CUDA GPU, llama.cpp picks its pinned host buffer type for CPU weights before the
    # extra buffers, then the mapped file (llama-model.cpp make_cpu_buft_list, llama-model-loader
    # "avoid using a host buffer when using mmap"): nothing is repacked. Metal has no host buffer type.
    if any(d.kind == "cuda" for d in gpus):
        features = frozenset()
    target = model_needs(target_info, n_ctx, kv_type, features, flash_attention=flash_attention, window_cache=True)
    draft = (model_needs(draft_info, n_ctx, kv_type, features, flash_attention=flash_attention)
             if draft_info is not None else None)
    host = next((d for d in devices if d.kind == "cpu"), None)
    host_free = host.usable if host else None  # no RAM given: only the GPU is checked

    def plan(verdict: str, gpu_layers: int | None, gpu_bytes: int, host_bytes: int) -> MemoryPlan:
        repacked = target.repacked + (draft.repacked if draft else 0) if gpu_layers is None else (
            target.cpu_repacked(gpu_layers if gpu_layers >= 0 else target.n_layer + 1))
        return MemoryPlan(n_ctx, kv_type, target, draft, devices, verdict, gpu_layers, gpu_bytes, host_bytes, (), (),
                          host_repacked=repacked)

    if not gpus:
        need = target.cpu_total + (draft.cpu_total if draft else 0)
        return plan(CPU_ONLY if host_free is None or need <= host_free else DOES_NOT_FIT, None, 0, need)
    # The draft runs K times per step, so it gets this machine's GPUs first (never an RPC server's:
    # each step would cross the network K times); the target gets what is left, on every device.
    local = [d for d in gpus if not d.is_remote]
    on_gpu = draft is not None and bool(local)
    draft_gpu = draft.gpu_total + draft.compute * (len(local) - 1) if on_gpu else 0
    draft_host = (draft.host_weights + draft.host_compute + draft.output_buffer if on_gpu else draft.cpu_total
                  ) if draft else 0
    draft_per_device = [_share(draft_gpu, d, local) if not d.is_remote else 0 for d in gpus]
    split = tensor_split or _free_memory_split(gpus, draft_per_device)
    full_gpu = draft_gpu + target.gpu_total + target.compute * (len(gpus) - 1)
    for n_gpu_layers in range(target.n_layer + 1, -1, -1):
        gpu, host_bytes = target.split(n_gpu_layers, len(gpus))
        per_device = _per_device(gpu - target.compute * len(gpus), target.compute, split, draft_per_device)
        if all(need <= d.usable for need, d in zip(per_device, gpus)) and (
                host_free is None or draft_host + host_bytes <= host_free):
            verdict = FULL_OFFLOAD if n_gpu_layers > target.n_layer else PARTIAL_OFFLOAD
            return replace(plan(verdict, -1 if verdict == FULL_OFFLOAD else n_gpu_layers, draft_gpu + gpu,
                                draft_host + host_bytes), device_bytes=tuple(per_device),
                           tensor_split=split if len(gpus) > 1 else ())
    per_device = _per_device(full_gpu - draft_gpu - target.compute * len(gpus), target.compute, split, draft_per_device)
    return replace(plan(DOES_NOT_FIT, None, full_gpu, draft_host + target.split(0, len(gpus))[1]),
                   device_bytes=tuple(per_device), tensor_split=split if len(gpus) > 1 else ())


def _share(total: int, device: Device, devices: list[Device]) -> int:
    """`device`'s part of `total` spread over `devices` by their usable memory."""
    usable = sum(d.usable for d in devices)
    return total // len(devices) if not usable else total * device.usable // usable


def _free_memory_split(gpus: list[Device], draft_per_device: list[int]) -> tuple[float, ...]:
    """Each device's share of the target: llama.cpp splits by free memory; we split by what is free
    once the draft is in, so that the GPU holding the draft is not given the same share as the others."""
    room = [max(d.usable - draft, 0) for d, draft in zip(gpus, draft_per_device)]
    total = sum(room)
    return tuple(r / total for r in room) if total else tuple(1 / len(gpus) for _ in gpus)


def _per_device(target_bytes: int, compute: int, split: tuple[float, ...], draft_per_device: list[int]) -> list[int]:
    """Bytes on each device: its share of the target's weights and cache, its compute buffer, its part
    of the draft. Shares past the given entries are 0, as in llama.cpp."""
    shares = [*split, *[0.0] * (len(draft_per_device) - len(split))][:len(draft_per_device)]
    total = sum(shares) or 1.0
    return [int(target_bytes * share / total) + compute + draft for share, draft in zip(shares, draft_per_device)]


def _suggestions(plan: MemoryPlan, target_info: ModelInfo, draft_info: ModelInfo | None,
                 features: frozenset[str], tensor_split: tuple[float, ...] = ()) -> tuple[str, ...]:
    goal = CPU_ONLY if not plan.gpus else FULL_OFFLOAD
    where = "in RAM" if goal == CPU_ONLY else "with full offload"
    suggestions = []

    def verdict(n_ctx: int, kv_type: str, split: tuple[float, ...] = tensor_split) -> MemoryPlan:
        return _plan(target_info, draft_info, n_ctx, kv_type, plan.devices, features, plan.flash_attention, split)

    if tensor_split and (other := verdict(plan.n_ctx, plan.kv_type, ())).verdict == goal:
        shares = ",".join(f"{share:.2f}" for share in other.tensor_split)
        suggestions.append(f"--tensor-split {shares} (by free memory, the draft counted) fits {where}")

    low, high = 0, plan.n_ctx // CTX_PAD  # the largest multiple of 256 that reaches the goal
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if verdict(mid * CTX_PAD, plan.kv_type).verdict == goal else (low, mid - 1)
    trained = target_info.context_length
    if trained and low * CTX_PAD > trained and verdict(trained, plan.kv_type).verdict == goal:
        suggestions.append(f"--ctx {trained} (the trained context) fits {where}")  # more would fit, but says less
    elif low and low * CTX_PAD < plan.n_ctx:
        suggestions.append(f"--ctx {low * CTX_PAD} fits {where}")
    for kv_type in _smaller_kv_types(plan.kv_type, [m for m in (target_info, draft_info) if m]):
        other = verdict(plan.n_ctx, kv_type)
        kv = format_bytes(other.target.kv + (other.draft.kv if other.draft else 0))
        if other.verdict == goal:
            suggestions.append(f"--kv-type {kv_type} fits {where} (KV caches {kv})")
        elif other.verdict == PARTIAL_OFFLOAD and (plan.gpu_layers is None or other.gpu_layers > plan.gpu_layers):
            suggestions.append(f"--kv-type {kv_type} puts {other.gpu_layers} of {plan.target_layer_count} "
                               f"target layers on the GPU (KV caches {kv})")
    if plan.host_repacked and plan.verdict == DOES_NOT_FIT:
        without = _plan(target_info, draft_info, plan.n_ctx, plan.kv_type, plan.devices, frozenset(),
                        plan.flash_attention, tensor_split)
        if without.fits:
            suggestions.append(f"--no-repack fits: it skips llama.cpp's repacked copy of the CPU weights "
                               f"({format_bytes(plan.host_repacked)})")
    if plan.verdict == PARTIAL_OFFLOAD:
        suggestions.append(f"keep --ctx {plan.n_ctx} with n_gpu_layers={plan.gpu_layers} "
                           "(the other target layers run on the CPU, several times slower)")
    if not suggestions:
        suggestions.append("use a smaller quantization of the target, a smaller draft, or a machine with more memory")
    return tuple(suggestions)


def _smaller_kv_types(kv_type: str, models: list[ModelInfo]) -> list[str]:
    size = KV_TYPES[kv_type][0] / KV_TYPES[kv_type][1]
    return [name for name, (b, v) in KV_TYPES.items()
            if b / v < size and all(kv_type_problem(m, name) is None for m in models)]


def _check_settings(models: list[ModelInfo], n_ctx: int, kv_type: str) -> None:
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx <= 0:
        raise InvalidSetting(f"--ctx must be a positive number of tokens, got {n_ctx}")
    if kv_type not in KV_TYPES:
        raise InvalidSetting(f"unknown KV cache type {kv_type!r}: use one of {', '.join(KV_TYPES)}")
    for info in models:
        check_cache_shape(info)
        if problem := kv_type_problem(info, kv_type):
            raise InvalidSetting(problem)
