"""Will the target, the draft and their KV caches fit, and what to change if they don't.

What each model needs comes from needs.py (its GGUF header, llama.cpp's rules); here it is
placed on the devices given: the draft on this machine's GPUs first, the target's layers split
over what is left, the verdict, and the settings that would make a pair fit.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ollama_spec.errors import InsufficientMemory, InvalidSetting
from ollama_spec.models.gguf_info import ModelInfo, format_bytes
from ollama_spec.models.heads import is_head
from ollama_spec.planning.devices import Device
from ollama_spec.planning.kv_cache import CTX_PAD, KV_TYPES, check_cache_shape, kv_type_problem
from ollama_spec.planning.needs import ModelNeeds, model_needs
from ollama_spec.planning.split import device_bytes, free_memory_split, plan_devices, share

FULL_OFFLOAD, PARTIAL_OFFLOAD, CPU_ONLY, DOES_NOT_FIT = "full_offload", "partial_offload", "cpu_only", "does_not_fit"


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
    n_seq: int = 1  # slots (serve --parallel): n_ctx counts all of them, n_ctx // n_seq tokens each
    # with several GPUs or RPC servers: each one's bytes (as `gpus` orders them) and share of the target
    device_bytes: tuple[int, ...] = ()
    tensor_split: tuple[float, ...] = ()
    mtp: bool = False  # the target's MTP (NextN) layers draft: counted with their cache (needs.model_needs)

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
            return (
                f"fits only with {self.gpu_layers} of {self.target_layer_count} target layers on the "
                f"{self.offload_word} (n_gpu_layers={self.gpu_layers}): {need} on the {self.offload_word}, "
                f"{format_bytes(self.host_bytes)} in RAM"
                f"{draft}"
            )
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
            "n_ctx": self.n_ctx,
            "kv_type": self.kv_type,
            "verdict": self.verdict,
            "fits": self.fits,
            "summary": self.summary,
            "gpu_layers": self.gpu_layers,
            "target_layer_count": self.target_layer_count,
            "gpu_bytes": self.gpu_bytes,
            "host_bytes": self.host_bytes,
            "target": self.target.to_json(),
            "draft": self.draft.to_json() if self.draft else None,
            "devices": [d.to_json() for d in self.devices],
            "suggestions": list(self.suggestions),
            "warnings": list(self.warnings),
            "repack": self.repack,
            "host_repacked": self.host_repacked,
            "tensor_split": list(self.tensor_split),
            "device_bytes": list(self.device_bytes),
        }


def plan_memory(
    target_info: ModelInfo,
    draft_info: ModelInfo | None,
    n_ctx: int,
    kv_type: str = "f16",
    devices: Sequence[Device] = (),
    *,
    notes: Sequence[str] = (),
    repack: bool = True,
    features: frozenset[str] = frozenset(),
    flash_attention: bool | None = None,
    tensor_split: tuple[float, ...] = (),
    remote: Sequence[Device] = (),
    main_device: int | None = None,
    n_seq: int = 1,
    mtp: bool = False,
) -> MemoryPlan:
    """Plan where the target (and draft) go on `devices` (GPUs, then RAM: llama/backends.discover_devices
    finds this machine's, and the `notes` it gives pass on as warnings).

    `repack`: whether the models load with llama.cpp's extra CPU buffers (canary.decide_repack);
    then the repacked copy of CPU weights is counted, by the CPU `features` llama.cpp reports
    (llama/backends.cpu_features for this machine). `flash_attention`
    None plans what "auto" does: on with a GPU, off where only the CPU runs the models.
    `tensor_split`: each offload device's share of the target (--tensor-split); () splits by the
    memory left once the draft is on this machine's GPUs, and the plan says that split.
    `remote`: RPC servers' devices (devices.rpc_device), before this machine's. `main_device`: with
    --split-mode none, the index of the one offload device that holds the target. `n_seq`: slots
    (serve --parallel), each its own `n_ctx` tokens in both caches. `mtp`: the target's MTP layers draft.
    """
    models = [m for m in (target_info, draft_info) if m is not None]
    _check_settings(models, n_ctx, kv_type)
    devices, notes = plan_devices(devices, notes, tensor_split, remote, main_device)
    warnings = [
        f"--ctx {n_ctx} is larger than {m.name or m.path.name}'s trained context ({m.context_length} tokens); "
        "output quality may drop past it"
        for m in models
        if m.context_length and n_ctx > m.context_length and not is_head(m)  # a head's only risk is acceptance
    ]
    features = features if repack else frozenset()
    if flash_attention is None:  # what runtime.choose_flash_attention picks: on with a GPU, off on the CPU
        flash_attention = kv_type != "f16" or any(d.is_gpu and not d.is_remote for d in devices)
    plan = _plan(target_info, draft_info, n_ctx * n_seq, kv_type, devices, features, flash_attention, tensor_split, mtp)
    plan = replace(plan, repack=repack, flash_attention=flash_attention, n_seq=n_seq)
    done = plan.verdict in (FULL_OFFLOAD, CPU_ONLY)
    suggestions = () if done else _suggestions(plan, target_info, draft_info, features, tensor_split)
    return replace(plan, suggestions=suggestions, warnings=tuple(warnings + notes))


def ensure_fits(plan: MemoryPlan) -> None:
    """Raise InsufficientMemory (verdict + what to change) unless the plan fits, split or not."""
    if plan.fits:
        return
    advice = "; or ".join(plan.suggestions)
    raise InsufficientMemory(f"{plan.summary}" + (f"; {advice}" if advice else ""))


def _plan(
    target_info: ModelInfo,
    draft_info: ModelInfo | None,
    n_ctx: int,
    kv_type: str,
    devices: tuple[Device, ...],
    features: frozenset[str],
    flash_attention: bool = True,
    tensor_split: tuple[float, ...] = (),
    mtp: bool = False,
) -> MemoryPlan:
    gpus = [d for d in devices if d.is_gpu]
    # Beside a CUDA GPU, llama.cpp picks its pinned host buffer type for CPU weights before the
    # extra buffers, then the mapped file (llama-model.cpp make_cpu_buft_list, llama-model-loader
    # "avoid using a host buffer when using mmap"): nothing is repacked. Metal has no host buffer type.
    if any(d.kind == "cuda" for d in gpus):
        features = frozenset()
    target = model_needs(
        target_info, n_ctx, kv_type, features, flash_attention=flash_attention, window_cache=True, mtp=mtp
    )
    draft = (
        model_needs(draft_info, n_ctx, kv_type, features, flash_attention=flash_attention)
        if draft_info is not None
        else None
    )
    host = next((d for d in devices if d.kind == "cpu"), None)
    host_free = host.usable if host else None  # no RAM given: only the GPU is checked

    def plan(verdict: str, gpu_layers: int | None, gpu_bytes: int, host_bytes: int) -> MemoryPlan:
        repacked = (
            target.repacked + (draft.repacked if draft else 0)
            if gpu_layers is None
            else (target.cpu_repacked(gpu_layers if gpu_layers >= 0 else target.n_layer + 1))
        )
        return MemoryPlan(
            n_ctx,
            kv_type,
            target,
            draft,
            devices,
            verdict,
            gpu_layers,
            gpu_bytes,
            host_bytes,
            (),
            (),
            host_repacked=repacked,
            mtp=mtp,
        )

    if not gpus:
        need = target.cpu_total + (draft.cpu_total if draft else 0)
        return plan(CPU_ONLY if host_free is None or need <= host_free else DOES_NOT_FIT, None, 0, need)
    return _offload_plan(target, draft, gpus, host_free, tensor_split, plan)


def _offload_plan(
    target: ModelNeeds,
    draft: ModelNeeds | None,
    gpus: list[Device],
    host_free: int | None,
    tensor_split: tuple[float, ...],
    plan: Callable[[str, int | None, int, int], MemoryPlan],
) -> MemoryPlan:
    """With offload devices: the most target layers on them that fit, the draft's first; `plan` makes the
    MemoryPlan of a verdict, its GPU layers and its bytes on the devices and in RAM."""
    # The draft runs K times per step, so it gets this machine's GPUs first (never an RPC server's:
    # each step would cross the network K times); the target gets what is left, on every device.
    local = [d for d in gpus if not d.is_remote]
    on_gpu = draft is not None and bool(local)
    draft_gpu = draft.gpu_total + draft.compute * (len(local) - 1) if on_gpu else 0
    draft_host = (
        (draft.host_weights + draft.host_compute + draft.output_buffer if on_gpu else draft.cpu_total) if draft else 0
    )
    draft_per_device = [share(draft_gpu, d, local) if not d.is_remote else 0 for d in gpus]
    split = tensor_split or free_memory_split(gpus, draft_per_device)
    full_gpu = draft_gpu + target.gpu_total + target.compute * (len(gpus) - 1)
    for n_gpu_layers in range(target.n_layer + 1, -1, -1):
        gpu, host_bytes = target.split(n_gpu_layers, len(gpus))
        per_device = device_bytes(gpu - target.compute * len(gpus), target.compute, split, draft_per_device)
        if all(need <= d.usable for need, d in zip(per_device, gpus)) and (
            host_free is None or draft_host + host_bytes <= host_free
        ):
            verdict = FULL_OFFLOAD if n_gpu_layers > target.n_layer else PARTIAL_OFFLOAD
            return replace(
                plan(
                    verdict, -1 if verdict == FULL_OFFLOAD else n_gpu_layers, draft_gpu + gpu, draft_host + host_bytes
                ),
                device_bytes=tuple(per_device),
                tensor_split=split if len(gpus) > 1 else (),
            )
    per_device = device_bytes(
        full_gpu - draft_gpu - target.compute * len(gpus), target.compute, split, draft_per_device
    )
    return replace(
        plan(DOES_NOT_FIT, None, full_gpu, draft_host + target.split(0, len(gpus))[1]),
        device_bytes=tuple(per_device),
        tensor_split=split if len(gpus) > 1 else (),
    )


def _suggestions(
    plan: MemoryPlan,
    target_info: ModelInfo,
    draft_info: ModelInfo | None,
    features: frozenset[str],
    tensor_split: tuple[float, ...] = (),
) -> tuple[str, ...]:
    goal = CPU_ONLY if not plan.gpus else FULL_OFFLOAD
    where = "in RAM" if goal == CPU_ONLY else "with full offload"
    suggestions = []

    def verdict(n_ctx: int, kv_type: str, split: tuple[float, ...] = tensor_split, cpu=features) -> MemoryPlan:
        return _plan(target_info, draft_info, n_ctx, kv_type, plan.devices, cpu, plan.flash_attention, split, plan.mtp)

    slot_ctx = plan.n_ctx // plan.n_seq
    fewer = next((n for n in range(plan.n_seq - 1, 0, -1) if verdict(slot_ctx * n, plan.kv_type).verdict == goal), 0)
    if fewer:
        suggestions.append(f"--parallel {fewer} fits {where}")

    if tensor_split and (other := verdict(plan.n_ctx, plan.kv_type, ())).verdict == goal:
        shares = ",".join(f"{share:.2f}" for share in other.tensor_split)
        suggestions.append(f"--tensor-split {shares} (by free memory, the draft counted) fits {where}")

    low, high = 0, plan.n_ctx // CTX_PAD  # the largest multiple of 256 that reaches the goal
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if verdict(mid * CTX_PAD, plan.kv_type).verdict == goal else (low, mid - 1)
    trained = target_info.context_length
    fitting = low * CTX_PAD // plan.n_seq // CTX_PAD * CTX_PAD  # each slot's share, a multiple of 256
    if trained and fitting > trained and verdict(trained * plan.n_seq, plan.kv_type).verdict == goal:
        suggestions.append(f"--ctx {trained} (the trained context) fits {where}")  # more would fit, but says less
    elif fitting and fitting < slot_ctx:
        suggestions.append(f"--ctx {fitting} fits {where}")
    for kv_type in _smaller_kv_types(plan.kv_type, [m for m in (target_info, draft_info) if m]):
        other = verdict(plan.n_ctx, kv_type)
        kv = format_bytes(other.target.kv + (other.draft.kv if other.draft else 0))
        if other.verdict == goal:
            suggestions.append(f"--kv-type {kv_type} fits {where} (KV caches {kv})")
        elif other.verdict == PARTIAL_OFFLOAD and (plan.gpu_layers is None or other.gpu_layers > plan.gpu_layers):
            suggestions.append(
                f"--kv-type {kv_type} puts {other.gpu_layers} of {plan.target_layer_count} "
                f"target layers on the GPU (KV caches {kv})"
            )
    if plan.host_repacked and plan.verdict == DOES_NOT_FIT:
        without = verdict(plan.n_ctx, plan.kv_type, tensor_split, frozenset())
        if without.fits:
            suggestions.append(
                f"--no-repack fits: it skips llama.cpp's repacked copy of the CPU weights "
                f"({format_bytes(plan.host_repacked)})"
            )
    if plan.verdict == PARTIAL_OFFLOAD:
        suggestions.append(
            f"keep --ctx {slot_ctx} with n_gpu_layers={plan.gpu_layers} "
            "(the other target layers run on the CPU, several times slower)"
        )
    if not suggestions:
        suggestions.append("use a smaller quantization of the target, a smaller draft, or a machine with more memory")
    return tuple(suggestions)


def _smaller_kv_types(kv_type: str, models: list[ModelInfo]) -> list[str]:
    size = KV_TYPES[kv_type][0] / KV_TYPES[kv_type][1]
    return [
        name
        for name, (b, v) in KV_TYPES.items()
        if b / v < size and all(kv_type_problem(m, name) is None for m in models)
    ]


def _check_settings(models: list[ModelInfo], n_ctx: int, kv_type: str) -> None:
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx <= 0:
        raise InvalidSetting(f"--ctx must be a positive number of tokens, got {n_ctx}")
    if kv_type not in KV_TYPES:
        raise InvalidSetting(f"unknown KV cache type {kv_type!r}: use one of {', '.join(KV_TYPES)}")
    for info in models:
        check_cache_shape(info)
        if problem := kv_type_problem(info, kv_type):
            raise InvalidSetting(problem)
