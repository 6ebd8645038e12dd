"""Which devices a memory plan uses, and each offload device's share of the target and its bytes."""

from __future__ import annotations

from collections.abc import Sequence

from ollama_spec.errors import InvalidSetting
from ollama_spec.planning.devices import CPU_PLAN_NOTE, Device


def plan_devices(
    devices: Sequence[Device],
    notes: Sequence[str],
    tensor_split: tuple[float, ...],
    remote: Sequence[Device],
    main_device: int | None,
) -> tuple[tuple[Device, ...], list[str]]:
    """The devices to plan on, RPC servers' first (with --split-mode none, one offload device), and the
    notes that still hold; InvalidSetting for a --tensor-split or --main-gpu they cannot take."""
    notes = list(notes)
    if remote:  # the target is planned onto the servers: "no GPU here" is not the whole story
        notes = [note for note in notes if not note.endswith(CPU_PLAN_NOTE)]
    devices = (*remote, *devices)  # llama.cpp's order: RPC servers' devices first
    offload = [d for d in devices if d.is_gpu]
    if len(tensor_split) > len(offload):  # llama.cpp would ignore the extra shares without a word
        if not offload:
            raise InvalidSetting("--tensor-split: there is no GPU or RPC server to split the target over")
        count = "is 1 device" if len(offload) == 1 else f"are {len(offload)} devices"
        raise InvalidSetting(
            f"--tensor-split has {len(tensor_split)} shares but there {count} to offload to "
            f"({', '.join(d.name for d in offload)}): give one share per device, RPC servers first"
        )
    if main_device is not None:  # --split-mode none: the target on that one device
        if offload and not 0 <= main_device < len(offload):
            raise InvalidSetting(
                f"--main-gpu {main_device}: there are {len(offload)} devices to offload to "
                f"({', '.join(d.name for d in offload)}), numbered from 0"
            )
        devices = tuple(d for d in devices if not d.is_gpu or d is offload[main_device])
    if not devices:
        raise InvalidSetting("no devices to plan for: give at least one GPU or the CPU RAM")
    return devices, notes


def share(total: int, device: Device, devices: list[Device]) -> int:
    """`device`'s part of `total` spread over `devices` by their usable memory."""
    usable = sum(d.usable for d in devices)
    return total // len(devices) if not usable else total * device.usable // usable


def free_memory_split(gpus: list[Device], draft_per_device: list[int]) -> tuple[float, ...]:
    """Each device's share of the target: llama.cpp splits by free memory; we split by what is free
    once the draft is in, so that the GPU holding the draft is not given the same share as the others."""
    room = [max(d.usable - draft, 0) for d, draft in zip(gpus, draft_per_device)]
    total = sum(room)
    return tuple(r / total for r in room) if total else tuple(1 / len(gpus) for _ in gpus)


def device_bytes(target_bytes: int, compute: int, split: tuple[float, ...], draft_per_device: list[int]) -> list[int]:
    """Bytes on each device: its share of the target's weights and cache, its compute buffer, its part
    of the draft. Shares past the given entries are 0, as in llama.cpp."""
    shares = [*split, *[0.0] * (len(draft_per_device) - len(split))][: len(draft_per_device)]
    total = sum(shares) or 1.0
    return [int(target_bytes * part / total) + compute + draft for part, draft in zip(shares, draft_per_device)]
