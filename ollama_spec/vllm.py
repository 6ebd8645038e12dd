"""The `vllm serve` command for a target/draft pair, and starting it where vLLM is installed.

vLLM serves many users at once (continuous batching, tensor parallelism over GPUs) with the
same draft/target pair; ollama-spec only writes its command line. Facts this rests on, read from
vLLM's released sources:

- Draft-model speculation is `--speculative-config '{"method": "draft_model", "model": ...,
  "num_speculative_tokens": K}'`. The `--speculative-model`/`--num-speculative-tokens` flags that
  tutorials show belonged to the V0 engine and are gone.
- vLLM 0.10.0 to 0.14.1 refuse draft models ("Speculative decoding with draft model is not
  supported yet"); 0.15.0 brought them back to the V1 engine (vllm-project/vllm#24322).
- The draft's tensor-parallel size must equal the target's (0.15 up to at least 0.33), and
  config.json's vocab sizes must match exactly unless `use_heterogeneous_vocab` (0.25.0 on) maps
  the shared tokens (Qwen2.5 0.5B–3B pad to 151,936 ids, 7B and up to 152,064).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from .errors import InvalidSetting, VllmUnavailable
from .vllm_repos import HfModel, check_pair

DRAFT_MODEL_VERSION = (0, 15, 0)  # the first release since 0.10 whose V1 engine takes a draft model
HETEROGENEOUS_VOCAB_VERSION = (0, 25, 0)  # `use_heterogeneous_vocab`
DEFAULT_K = 5  # vLLM drafts a fixed K; ollama-spec's per-step `auto` has no counterpart there
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
BF16_BYTES = 2  # vLLM loads the original weights, BF16 for these families
VERSION_TIMEOUT_S = 120  # `vllm --version` imports torch
INSTALL_HINT = "pip install 'vllm>={}' (best in its own virtual environment: it pins its own torch)"
_SPECULATION_FLAGS = ("--speculative-config", "--speculative-model", "--num-speculative-tokens")
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class VllmSettings:
    k: int = DEFAULT_K
    tp: int = 1  # the target's --tensor-parallel-size
    draft_tp: int | None = None  # None: the same as tp, the only value vLLM accepts for a draft model
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    extra_args: tuple[str, ...] = ()  # passed to `vllm serve` after ours


@dataclass(frozen=True)
class VllmCommand:
    target: HfModel
    draft: HfModel
    speculative_config: dict
    argv: tuple[str, ...]  # starts with "vllm", "serve"
    min_version: tuple[int, int, int]
    notes: tuple[str, ...]
    url: str  # the OpenAI API it serves

    @property
    def shell(self) -> str:
        return shlex.join(self.argv)

    @property
    def bench(self) -> str:
        """The command that measures the server like any OpenAI-compatible one."""
        return shlex.join(["ollama-spec", "bench", self.target.repo, "--url", self.url])


def build_command(target: HfModel, draft: HfModel, settings: VllmSettings = VllmSettings()) -> VllmCommand:
    """The `vllm serve` command line for the pair; refuses what vLLM would refuse after loading."""
    if settings.k < 1:
        raise InvalidSetting(f"-k must be at least 1, got {settings.k}")
    if settings.tp < 1:
        raise InvalidSetting(f"--tp must be at least 1, got {settings.tp}")
    draft_tp = settings.tp if settings.draft_tp is None else settings.draft_tp
    if draft_tp != settings.tp:
        raise InvalidSetting(f"vLLM runs a draft model only with the target's tensor-parallel size: --draft-tp "
                             f"{draft_tp} with --tp {settings.tp} is refused (vLLM 0.15 to 0.33); drop --draft-tp")
    for arg in settings.extra_args:
        flag = arg.split("=", 1)[0].replace("_", "-")
        if flag in _SPECULATION_FLAGS:
            raise InvalidSetting(f"{arg.split('=', 1)[0]} in the extra vLLM arguments: this command writes "
                                 "--speculative-config itself (--speculative-model and --num-speculative-tokens "
                                 "are gone from current vLLM)")
    pair = check_pair(target, draft)
    config = {"method": "draft_model", "model": draft.repo, "num_speculative_tokens": settings.k,
              "draft_tensor_parallel_size": draft_tp}
    min_version = DRAFT_MODEL_VERSION
    notes = [*target.notes, *draft.notes]
    if not pair.same_vocab_size:
        config["use_heterogeneous_vocab"] = True
        min_version = HETEROGENEOUS_VOCAB_VERSION
        notes.append(f"the vocabularies are the same but config.json pads them differently ({target.vocab_size:,} "
                     f"vs {draft.vocab_size:,}): use_heterogeneous_vocab maps the shared tokens, and vLLM then "
                     "drafts greedily (still exact)")
    elif not pair.known:
        notes.append("vLLM checks that the two vocabularies match when it loads them")
    gated = sorted({m.repo.split("/")[0] for m in (target, draft) if m.gated})
    if gated:
        notes.append(f"{', '.join(gated)} repositories are gated: accept the license on huggingface.co and set "
                     "HF_TOKEN")
    weights = _weights_note(target, draft, settings.tp)
    if weights:
        notes.append(weights)
    argv = ("vllm", "serve", target.repo, "--tensor-parallel-size", str(settings.tp), "--host", settings.host,
            "--port", str(settings.port), "--speculative-config", json.dumps(config), *settings.extra_args)
    return VllmCommand(target, draft, config, argv, min_version, tuple(notes), _url(settings.host, settings.port))


def find_vllm() -> list[str] | None:
    """How to run vLLM's CLI here: `vllm` on PATH, beside this Python, or this Python's vllm module."""
    on_path = shutil.which("vllm")
    if on_path:
        return [on_path]
    beside = Path(sys.executable).parent / "vllm"
    if beside.is_file() and os.access(beside, os.X_OK):
        return [str(beside)]
    if importlib.util.find_spec("vllm") is not None:
        return [sys.executable, "-m", "vllm.entrypoints.cli.main"]
    return None


def installed_version(launcher: list[str]) -> tuple[int, int, int]:
    """The version `vllm --version` prints."""
    try:
        result = subprocess.run([*launcher, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S,
                                check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise VllmUnavailable(f"could not run `{shlex.join(launcher)} --version`: {exc}") from None
    found = [parse_version(line) for line in result.stdout.splitlines() if _VERSION.search(line)]
    if result.returncode != 0 or not found:
        said = (result.stderr.strip().splitlines() or ["no version printed"])[-1]
        raise VllmUnavailable(f"`{shlex.join(launcher)} --version` failed: {said}")
    return found[-1]


def parse_version(text: str) -> tuple[int, int, int]:
    """(major, minor, patch) from the first version in `text` ('0.15.1.dev3+gabc' → (0, 15, 1))."""
    match = _VERSION.search(text)
    if match is None:
        raise ValueError(f"no version in {text!r}")
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)


def version_text(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def ready_launcher(min_version: tuple[int, int, int]) -> list[str]:
    """vLLM's CLI when it is installed and new enough for the command; else a clear error."""
    launcher = find_vllm()
    if launcher is None:
        raise VllmUnavailable(f"vLLM is not installed here: {INSTALL_HINT.format(version_text(min_version))}, "
                              "or run the printed command on the machine that has it")
    version = installed_version(launcher)
    if version < min_version:
        raise VllmUnavailable(f"vLLM {version_text(version)} ({launcher[0]}) is too old: this command needs vLLM >= "
                              f"{version_text(min_version)} (0.10 to 0.14 refuse draft models); "
                              f"pip install -U 'vllm>={version_text(min_version)}'")
    return launcher


def exec_vllm(command: VllmCommand, launcher: list[str]) -> NoReturn:
    """Replace this process with `vllm serve ...` (signals and the exit status are vLLM's own)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(launcher[0], [*launcher, *command.argv[1:]])


def _url(host: str, port: int) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"  # where a client on this machine reaches a server bound to every interface
    return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"


def _weights_note(target: HfModel, draft: HfModel, tp: int) -> str | None:
    if target.parameters is None or draft.parameters is None:
        return None
    total = (target.parameters + draft.parameters) * 1e9 * BF16_BYTES / 2**30
    per_gpu = f", {total / tp:.0f} GiB on each of {tp} GPUs" if tp > 1 else " on the GPU"
    return (f"BF16 weights: about {total:.0f} GiB for the pair{per_gpu}, before the KV cache (vLLM takes 90 % of "
            "each GPU by default); a quantized repository (AWQ, GPTQ, FP8) as TARGET needs less")
