"""Is llama.cpp's repacked CPU path (use_extra_bufts) safe on this machine? Decided before loading.

On some machines llama.cpp's AMX kernels kill the process with SIGSEGV on the first quantized
matrix product (a VM that reports AMX but does not grant its tiles), and nothing can catch that
in the process. So a canary loads two tiny quantized models (Q4_0 and Q8_0, the types AMX,
AVX2 and Arm repack) with repacking on in a subprocess and evaluates a few tokens: a crash
there costs nothing. The verdict is cached per llama-cpp-python version, llama.cpp's CPU
features, the CPU's flags and the kernel, and made again when any of them changes. A user can
force either way with --repack/--no-repack or OLLAMA_SPEC_REPACK=1/0.

`python -m ollama_spec.llama.canary MODEL.gguf...` is the canary itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ollama_spec.config import cache_dir
from ollama_spec.errors import InvalidSetting
from ollama_spec.llama.backends import cpu_features
from ollama_spec.planning.repack import has_extra_buffers

ENV_VAR = "OLLAMA_SPEC_REPACK"
TIMEOUT_S = 120.0
CANARY_TYPES = ("Q4_0", "Q8_0")
_OK = "canary ok"

Runner = Callable[[Sequence[str], float], subprocess.CompletedProcess]


@dataclass(frozen=True)
class RepackDecision:
    """Whether to load with llama.cpp's extra (repacked) CPU buffers, and why."""

    enabled: bool
    source: str  # "--repack/--no-repack", ENV_VAR, "canary", "cached canary", "not built in"
    detail: str
    fresh: bool = False  # the canary ran just now

    @property
    def note(self) -> str | None:
        """The one line to say when the canary has just turned repacking off."""
        if self.enabled or not self.fresh:
            return None
        return (
            f"llama.cpp's repacked CPU weights failed a test run on this machine ({self.detail}); "
            f"loading without them (use_extra_bufts=false). Force with --repack or {ENV_VAR}=1."
        )

    def to_json(self) -> dict:
        return {"enabled": self.enabled, "source": self.source, "detail": self.detail}


@dataclass(frozen=True)
class CanaryResult:
    passed: bool
    detail: str


def decide_repack(
    force: bool | None = None, *, runner: Runner | None = None, features: frozenset[str] | None = None
) -> RepackDecision:
    """The repack choice for this process: a flag, else ENV_VAR, else the (cached) canary's verdict."""
    if force is not None:
        return RepackDecision(force, "--repack/--no-repack", "forced on the command line")
    env = os.environ.get(ENV_VAR, "").strip().lower()
    if env:
        if env not in ("0", "1", "true", "false", "yes", "no", "on", "off"):
            raise InvalidSetting(f"{ENV_VAR}={os.environ[ENV_VAR]!r}: use 1 (repack) or 0 (don't)")
        return RepackDecision(env in ("1", "true", "yes", "on"), ENV_VAR, f"{ENV_VAR}={os.environ[ENV_VAR]}")
    features = cpu_features() if features is None else features
    if not has_extra_buffers(features):
        return RepackDecision(True, "not built in", "this llama.cpp build has no extra CPU buffer types")
    key = machine_key(features)
    cached = _read_cache(key)
    if cached is not None:
        return RepackDecision(cached.passed, "cached canary", cached.detail)
    result = run_canary(runner or _run)
    _write_cache(key, result)
    return RepackDecision(result.passed, "canary", result.detail, fresh=True)


def run_canary(runner: Runner, timeout: float = TIMEOUT_S) -> CanaryResult:
    """Load the canary models in a subprocess through `runner`; pass only on a clean run that says so."""
    try:
        return _run_canary(canary_models(cache_dir() / "canary"), runner, timeout)
    except OSError:  # a read-only cache: write the models for this run only
        with tempfile.TemporaryDirectory(prefix="ollama-spec-canary-") as folder:
            return _run_canary(canary_models(Path(folder)), runner, timeout)


def _run_canary(paths: list[Path], runner: Runner, timeout: float) -> CanaryResult:
    command = [sys.executable, "-m", "ollama_spec.llama.canary", *map(str, paths)]
    try:
        done = runner(command, timeout)
    except subprocess.TimeoutExpired:
        return CanaryResult(False, f"the test run did not finish in {timeout:g} s")
    if done.returncode < 0:
        try:
            name = signal.Signals(-done.returncode).name
        except ValueError:
            name = f"signal {-done.returncode}"
        return CanaryResult(False, f"the test run died with {name}")
    if done.returncode != 0 or _OK not in (done.stdout or ""):
        last = (done.stderr or done.stdout or "").strip().splitlines()[-1:] or ["no output"]
        return CanaryResult(False, f"the test run failed with exit status {done.returncode}: {last[0][:200]}")
    return CanaryResult(True, f"a test run with repacked {' and '.join(CANARY_TYPES)} weights passed")


def machine_key(features: frozenset[str]) -> dict:
    """What the verdict depends on: re-run the canary when any of it changes."""
    from importlib.metadata import version

    return {
        "llama_cpp_python": version("llama-cpp-python"),
        "llama_cpp_features": sorted(features),
        "cpu_flags": hashlib.sha256(_cpu_flags().encode()).hexdigest()[:16],
        "kernel": platform.release(),
        "machine": platform.machine(),
    }


def canary_models(folder: Path) -> list[Path]:
    """The tiny pair's target as Q4_0 and Q8_0 GGUFs, written once into `folder`."""
    from ollama_spec.synthetic.catalog import PAIRS
    from ollama_spec.synthetic.models import make_weights, write_gguf
    from ollama_spec.synthetic.tokenizer import build_vocabulary

    spec = PAIRS["tiny"]
    paths = [folder / f"tiny-{dtype.lower()}.gguf" for dtype in CANARY_TYPES]
    if all(p.exists() for p in paths):
        return paths
    folder.mkdir(parents=True, exist_ok=True)
    vocab = build_vocabulary(spec.vocab_size, spec.n_merges)
    weights = make_weights(spec.arch, vocab.size, spec.recipe, spec.draft_layers)
    for dtype, path in zip(CANARY_TYPES, paths):
        staged = path.with_suffix(f".{os.getpid()}.tmp")
        write_gguf(
            staged, name=path.stem, arch=spec.arch, n_layer=spec.arch.n_layer, vocab=vocab, weights=weights, dtype=dtype
        )
        os.replace(staged, path)
    return paths


def _run(command: Sequence[str], timeout: float) -> subprocess.CompletedProcess:
    package_root = str(Path(__file__).resolve().parents[2])  # importable even when not installed
    path = os.pathsep.join(p for p in (package_root, os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, **{ENV_VAR: "1", "PYTHONPATH": path})
    return subprocess.run(list(command), capture_output=True, text=True, timeout=timeout, env=env, check=False)


def _cache_file() -> Path:
    return cache_dir() / "repack-canary.json"


def _read_cache(key: dict) -> CanaryResult | None:
    try:
        data = json.loads(_cache_file().read_text(encoding="utf-8"))
        if data.get("key") == key:
            return CanaryResult(bool(data["passed"]), str(data["detail"]))
    except (OSError, ValueError, KeyError, AttributeError):
        pass  # no cache, or an unreadable one: run the canary again
    return None


def _write_cache(key: dict, result: CanaryResult) -> None:
    path = _cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        staged = path.with_suffix(f".{os.getpid()}.tmp")
        staged.write_text(json.dumps({"key": key, "passed": result.passed, "detail": result.detail}), encoding="utf-8")
        os.replace(staged, path)
    except OSError:
        pass  # a read-only cache only means the canary runs again next time


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def _canary_main(paths: Sequence[str]) -> int:
    """Load each model with repacking on, evaluate a batch and one more token, check the logits."""
    import numpy as np

    from ollama_spec.llama.model import LoadedModel, LoadSettings

    for path in paths:
        with LoadedModel(path, LoadSettings(n_ctx=256, n_gpu_layers=0, use_extra_bufts=True)) as model:
            batch = model.eval([model.bos_token, 300, 301, 302, 303, 304, 305, 306], logits="all")
            one = model.eval([307])
            if not (np.isfinite(batch).all() and np.isfinite(one).all()):
                print(f"{path}: logits are not finite", file=sys.stderr)
                return 1
    print(_OK)
    return 0


if __name__ == "__main__":
    sys.exit(_canary_main(sys.argv[1:]))
