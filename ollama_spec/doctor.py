"""`doctor`'s findings: what stands between this machine and GPU-offloaded speculation, and the fix.

`find_problems` is pure (facts in, problems out) so each rule is tested without a GPU;
`gather` reads the facts from this machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ollama_spec.config import ollama_var
from ollama_spec.errors import OllamaSpecError, StoreUnreadable
from ollama_spec.llama.backends import read_backends
from ollama_spec.models.daemon import DaemonStatus, daemon_status
from ollama_spec.models.gguf_info import format_bytes
from ollama_spec.models.store import find_store_root
from ollama_spec.planning.backends import BackendReport
from ollama_spec.planning.devices import CUDA_BUILD_HINT, METAL_BUILD_HINT, Device, present_gpus

SHORT_FRACTION = 0.5  # a GPU with less than this share free is "short": say who holds it
CHECKOUT = Path(__file__).resolve().parents[1]  # the source tree, when installed with `make install`


@dataclass(frozen=True)
class Problem:
    what: str
    fix: str  # one command

    def to_json(self) -> dict:
        return {"problem": self.what, "fix": self.fix}


@dataclass(frozen=True)
class Facts:
    offload: bool
    gpus: tuple[Device, ...]  # as nvidia-ml-py / the OS report them, usable or not
    backends: BackendReport | None
    store: str | None  # the store root, or None
    store_error: str | None
    daemon: DaemonStatus
    store_unreadable: bool = False
    store_setting: str | None = None  # "OLLAMA_MODELS" or "--models-dir" when the store path was given


def gather(models_dir: str | None = None) -> Facts:
    """Read the facts from this machine (llama.cpp, NVML, the store, the Ollama daemon)."""
    from ollama_spec.llama import load_params as runtime  # loads llama.cpp

    try:
        backends = read_backends()
    except (OSError, AttributeError):  # an older or unusual build without the registry symbols
        backends = None
    store = store_error = None
    unreadable = False
    try:
        store = str(find_store_root(models_dir).path)
    except StoreUnreadable as exc:
        store_error, unreadable = str(exc), True
    except OllamaSpecError as exc:
        store_error = str(exc)
    setting = "--models-dir" if models_dir else ("OLLAMA_MODELS" if ollama_var("OLLAMA_MODELS") else None)
    return Facts(
        runtime.gpu_offload_supported(),
        tuple(present_gpus()),
        backends,
        store,
        store_error,
        daemon_status(),
        unreadable,
        setting,
    )


def rebuild_command(kind: str) -> str:
    """The one command that rebuilds llama-cpp-python for this GPU kind ("cuda" or "metal")."""
    if (CHECKOUT / "scripts" / "install-backend.sh").exists() and (CHECKOUT / "Makefile").exists():
        return f"make install BACKEND={kind}  (in {CHECKOUT})"
    return CUDA_BUILD_HINT if kind == "cuda" else METAL_BUILD_HINT


def find_problems(facts: Facts) -> list[Problem]:
    """Each thing that keeps ollama-spec off the GPU or away from the models, with its fix."""
    problems = []
    if facts.gpus and not facts.offload:
        gpu = facts.gpus[0]
        problems.append(
            Problem(f"llama-cpp-python is a CPU-only build, so {gpu.name} is not used", rebuild_command(gpu.kind))
        )
    if facts.offload and facts.backends is not None:
        seen = [d for d in facts.backends.devices if d.type in ("gpu", "igpu")]
        nvidia = [g for g in facts.gpus if g.kind == "cuda"]
        if len(seen) < len(nvidia):
            problems.append(
                Problem(
                    f"llama.cpp sees {len(seen)} GPU(s) but nvidia-ml-py reports {len(nvidia)}: "
                    "its CUDA runtime cannot use them all (driver too old for the toolkit it was "
                    "built with, or CUDA_VISIBLE_DEVICES)",
                    "nvidia-smi",
                )
            )
    for gpu in facts.gpus:
        if gpu.free < SHORT_FRACTION * gpu.total:
            problems.append(_short_gpu(gpu, facts.daemon))
    if facts.store_error:
        problems.append(Problem(facts.store_error, _store_fix(facts)))
    return problems


def _store_fix(facts: Facts) -> str:
    if facts.store_unreadable:
        return "sudo usermod -aG ollama $USER"
    # a pull goes through the daemon, which stores by its own environment: it would not fix this setting
    if facts.store_setting == "OLLAMA_MODELS":
        return "unset OLLAMA_MODELS  (or set it to the folder that holds blobs/ and manifests/)"
    if facts.store_setting:
        return f"give {facts.store_setting} the folder that holds blobs/ and manifests/"
    return "ollama-spec pull llama3.2:1b"


def _short_gpu(gpu: Device, daemon: DaemonStatus) -> Problem:
    free = f"{gpu.name} has {format_bytes(gpu.free)} free of {format_bytes(gpu.total)}"
    held = [m for m in daemon.models if m.size_vram]
    if held:
        names = ", ".join(f"{m.name} ({format_bytes(m.size_vram)})" for m in held)
        return Problem(f"{free}; Ollama holds {names}", " && ".join(f"ollama stop {m.name}" for m in held))
    return Problem(f"{free}; another process holds the rest", "nvidia-smi  (lists the processes using it)")
