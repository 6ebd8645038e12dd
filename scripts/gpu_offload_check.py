"""Load TARGET and DRAFT as bench does and show, from llama.cpp's own load log, where they went.

    python scripts/gpu_offload_check.py TARGET DRAFT --models-dir DIR --ctx N [--cpu]

Per model: "offloaded X/Y layers to GPU" and the buffers llama.cpp allocated per device, next to
what `check` estimated; then the GPU memory the process really holds (nvidia-ml-py). Exits 1 when
a layer stayed on the CPU (unless --cpu, where no layer is expected on a GPU).
"""

from __future__ import annotations

import argparse
import re
import sys

from ollama_spec.llama.backends import cpu_features, discover_devices
from ollama_spec.llama.load_params import gpu_offload_supported
from ollama_spec.llama.log import clear_log, recent_log
from ollama_spec.llama.model import LoadedModel, LoadSettings
from ollama_spec.models.gguf_info import format_bytes
from ollama_spec.models.resolve import resolve_model
from ollama_spec.planning.memory import plan_memory

OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
BUFFER = re.compile(r"(\S+) (model|KV|RS|compute) buffer size =\s*([\d.]+) MiB")
MIB = 1 << 20
GPU_BUFFERS = ("CUDA", "Metal", "MTL", "ROCm")  # llama.cpp's buffer names on GPUs (CUDA_Host is pinned RAM)


def gpu_used() -> int | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # noqa: BLE001 - no NVIDIA driver: nothing to compare
        return None


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("draft")
    parser.add_argument("--models-dir", required=True)
    parser.add_argument("--ctx", type=int, default=4096)
    parser.add_argument("--cpu", action="store_true")
    args = parser.parse_args()
    target, draft = (resolve_model(n, args.models_dir) for n in (args.target, args.draft))
    devices, notes = discover_devices()
    plan = plan_memory(target.info, draft.info, args.ctx, devices=devices, notes=notes, features=cpu_features())
    before = gpu_used()
    loaded, ok = [], True
    for role, model, needs in (("target", target, plan.target), ("draft", draft, plan.draft)):
        clear_log()
        loaded.append(LoadedModel(model.path, LoadSettings(n_ctx=args.ctx, n_gpu_layers=-1)))
        log = "".join(recent_log())
        offload = OFFLOADED.search(log)
        # llama.cpp logs "offloaded N/N" whenever its build could offload, which a build with the RPC
        # backend always can: without a GPU here, nothing was.
        done, total = (
            (int(offload.group(1)), int(offload.group(2)))
            if offload and gpu_offload_supported()
            else (0, needs.n_layer + 1)
        )
        buffers: dict[str, float] = {}
        for device, _kind, mib in BUFFER.findall(log):
            buffers[device] = buffers.get(device, 0.0) + float(mib)
        gpu_mib = sum(v for k, v in buffers.items() if k.startswith(GPU_BUFFERS) and "Host" not in k)
        # check plans the GPU part under full offload, or everything in RAM without a GPU
        estimate, used, where = (
            (needs.gpu_total, gpu_mib, "on the GPU")
            if plan.gpus
            else (needs.cpu_total, sum(buffers.values()), "in RAM")
        )
        print(
            f"{role:<7} {model.name}: offloaded {done}/{total} layers to GPU; llama.cpp's buffers: "
            + ", ".join(f"{k} {v:.0f} MiB" for k, v in buffers.items())
        )
        print(
            f"        {where}: llama.cpp {used:.0f} MiB, check's estimate {estimate / MIB:.0f} MiB"
            + (f" ({(estimate / MIB - used) / used:+.1%})" if used else "")
        )
        ok &= args.cpu or done == total
    after = gpu_used()
    if before is not None and after is not None:
        print(
            f"GPU memory held by this process (nvidia-ml-py): {format_bytes(after - before)}; "
            f"check's estimate for the pair: {format_bytes(plan.gpu_bytes)}"
        )
    for model in loaded:
        model.close()
    if not ok:
        print("NOT FULLY OFFLOADED: see the lines above", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
