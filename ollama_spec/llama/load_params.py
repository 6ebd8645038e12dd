"""What llama.cpp is told when a model loads: its threads, flash attention and KV cache types, its devices
and split, header overrides, LoRA adapters."""

from __future__ import annotations

import ctypes
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import llama_cpp
import psutil

from ollama_spec.errors import ModelLoadError
from ollama_spec.llama import rpc
from ollama_spec.llama.backends import has_local_gpu, local_gpus
from ollama_spec.llama.log import last_error
from ollama_spec.planning.placement import Placement


def default_threads() -> int:
    """Physical cores, as llama.cpp's own default: hyper-threads only contend for the same units."""
    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def gpu_offload_supported() -> bool:
    """Can this build put layers on a GPU of this machine? (Not llama_supports_gpu_offload: with the
    RPC backend built in, it says yes on every machine.)"""
    return has_local_gpu()


KV_TYPES = {"f16": llama_cpp.GGML_TYPE_F16, "q8_0": llama_cpp.GGML_TYPE_Q8_0, "q4_0": llama_cpp.GGML_TYPE_Q4_0}
FLASH_ATTENTION = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


# "auto" where only a timing can tell: flash attention is chosen by timing the model both ways
# (engine/flash_choice.py, from `flash_attention_from_timings`)
MEASURE = "measure"


def choose_flash_attention(requested: str, kv_type: str = "f16", gpu_layers: int = -1, n_seq: int = 1) -> str:
    """ "auto" made concrete per backend, from measurement: on a CPU, flash attention makes small
    verify batches slower deep into a context (batches of 4-9 tokens 12-16 % slower at 1,024
    tokens on a 2-core EPYC, 30 % at 384 on a Xeon with AMX), so a model running on the CPU alone
    gets it off; on a GPU llama.cpp's own choice (on) stands. A quantized KV cache needs it on.
    With several slots (`n_seq`) on a CPU it depends on the model: the demo pair's 4 slots run
    faster with it (its 4-slot verify batch 0.75x the time), a pair whose passes take under a
    millisecond 2-3x slower, so there it is MEASURE."""
    if requested != "auto":
        return requested
    if kv_type != "f16":
        return "on"
    if gpu_offload_supported() and gpu_layers != 0:
        return "auto"
    return MEASURE if n_seq > 1 else "off"


# Timed slots turn flash attention off only where it is this much slower on the whole; within it
# llama.cpp's own choice (on) stands, so a busy moment during the timing does not turn it off where it
# helps (the demo pair's 4 slots: 0.85x the time with it, timed at a load average of 5)
FLASH_OFF_AT = 1.1


def flash_attention_from_timings(on: Sequence[float], off: Sequence[float]) -> str:
    """ "on" or "off" from the same shapes timed both ways (e.g. a lone slot's verify batch and every
    slot's): off where flash attention takes FLASH_OFF_AT times as long or more on the whole. Each shape
    counts alike, by the ratio of its two times (their geometric mean): a lone stream's rate weighs as
    much as a full server's, whatever their batches cost."""
    if len(on) != len(off) or not on:
        raise ValueError("flash attention is chosen from the same shapes timed both ways")
    ratio = math.prod(a / b for a, b in zip(on, off)) ** (1 / len(on))
    return "off" if ratio >= FLASH_OFF_AT else "on"


SPLIT_MODES = {
    "none": llama_cpp.LLAMA_SPLIT_MODE_NONE,
    "layer": llama_cpp.LLAMA_SPLIT_MODE_LAYER,
    "row": llama_cpp.LLAMA_SPLIT_MODE_ROW,
}


def load_lora_adapters(model, paths: Sequence[Path], mark: int, owner: str) -> list:
    """Load GGUF LoRA adapters onto a llama.cpp model (each context sets them at scale 1, as Ollama's
    --lora does: set_lora_adapters); on failure none stays loaded."""
    adapters: list = []
    try:
        for path in paths:
            adapter = llama_cpp.llama_adapter_lora_init(model, str(path).encode())
            if not adapter:
                raise ModelLoadError(
                    f"llama.cpp could not apply the LoRA adapter {Path(path).name} to {owner}: "
                    f"{last_error(mark) or 'not an adapter for this model'}"
                )
            adapters.append(adapter)
    except ModelLoadError:
        for adapter in adapters:
            llama_cpp.llama_adapter_lora_free(adapter)
        raise
    return adapters


def apply_lora_adapters(model, ctx, paths: Sequence[Path], mark: int, owner: str) -> list:
    """Load GGUF LoRA adapters onto a llama.cpp model and set them on its context at scale 1, as
    Ollama's --lora does; on failure none stays loaded. (The model frees them when it is freed.)"""
    adapters = load_lora_adapters(model, paths, mark, owner)
    if adapters and set_lora_adapters(ctx, adapters) != 0:
        for adapter in adapters:
            llama_cpp.llama_adapter_lora_free(adapter)
        raise ModelLoadError(f"llama.cpp could not set the LoRA adapters of {owner} on its context")
    return adapters


def set_lora_adapters(ctx, adapters: Sequence) -> int:
    """Set loaded adapters on a context (another context on the same weights needs them too)."""
    array = (llama_cpp.llama_adapter_lora_p_ctypes * len(adapters))(*adapters)
    scales = (ctypes.c_float * len(adapters))(*[1.0] * len(adapters))
    return llama_cpp.llama_set_adapters_lora(ctx, array, len(adapters), scales)


def apply_placement(model_params, placement: Placement) -> tuple:
    """Set the model's devices, split mode and tensor split; the ctypes arrays they point into, to keep alive.

    With no RPC server registered in this process, llama.cpp's default device list is this
    machine's GPUs and is left alone. Once any is, the list is given explicitly: the servers this
    model names (first, as llama.cpp orders them), then the local GPUs; so a draft, which names
    none, stays on this machine.
    """
    model_params.split_mode = SPLIT_MODES[placement.split_mode]
    model_params.main_gpu = placement.main_gpu
    arrays: list = []
    if placement.tensor_split:
        split = (ctypes.c_float * llama_cpp.LLAMA_MAX_DEVICES)(*placement.tensor_split)
        model_params.tensor_split = split
        arrays.append(split)
    servers = rpc.parse_endpoints(",".join(placement.rpc_servers)) if placement.rpc_servers else ()
    rpc.register(servers)
    if rpc.any_registered():
        handles = [*rpc.device_handles(servers), *local_gpus(), None]
        devices = (ctypes.c_void_p * len(handles))(*handles)
        model_params.devices = ctypes.cast(devices, ctypes.c_void_p)
        arrays.append(devices)
    return tuple(arrays)


def kv_override_array(overrides):
    """llama.cpp's kv_overrides array (sentinel-terminated), as llama_cpp.Llama builds it."""
    if not overrides:
        return None
    array = (llama_cpp.llama_model_kv_override * (len(overrides) + 1))()
    for item, (key, value) in zip(array, overrides):
        item.key = key.encode("utf-8")
        if isinstance(value, bool):
            item.tag, item.value.val_bool = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_BOOL, value
        elif isinstance(value, int):
            item.tag, item.value.val_i64 = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_INT, value
        elif isinstance(value, float):
            item.tag, item.value.val_f64 = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_FLOAT, value
        else:
            raw = str(value).encode("utf-8")[:127].ljust(128, b"\0")
            item.tag = llama_cpp.LLAMA_KV_OVERRIDE_TYPE_STR
            address = ctypes.addressof(item.value) + llama_cpp.llama_model_kv_override_value.val_str.offset
            ctypes.memmove(address, raw, 128)
    array[-1].key = b"\0"
    return array


@contextmanager
def extra_bufts_default(enabled: bool) -> Iterator[None]:
    """Make `llama_cpp.Llama` (which has no such argument) load with use_extra_bufts = `enabled`."""
    bindings = llama_cpp.llama_cpp  # the module llama.py calls it through, on each load
    original = bindings.llama_model_default_params

    def params():
        p = original()
        p.use_extra_bufts = enabled
        return p

    bindings.llama_model_default_params = params
    try:
        yield
    finally:
        bindings.llama_model_default_params = original
