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

from ollama_spec.errors import InvalidSetting, VllmUnavailable
from ollama_spec.integrations.vllm_repos import HfModel, PairCheck, check_pair

DRAFT_MODEL_VERSION = (0, 15, 0)  # the first release since 0.10 whose V1 engine takes a draft model
HETEROGENEOUS_VOCAB_VERSION = (0, 25, 0)  # `use_heterogeneous_vocab`
DEFAULT_K = 5  # vLLM drafts a fixed K; ollama-spec's per-step `auto` has no counterpart there
# Past this K (also the top of ollama-spec's own auto range) the last drafts of a step are rarely accepted.
LARGE_K = 16
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
BF16_BYTES = 2  # vLLM loads the original weights, BF16 for these families
VERSION_TIMEOUT_S = 120  # `vllm --version` imports torch
INSTALL_HINT = "pip install 'vllm>={}' (best in its own virtual environment: it pins its own torch)"
_SPECULATION_FLAGS = ("--speculative-config", "--speculative-model", "--num-speculative-tokens")
# vllm serve options this command writes itself, and the flag of ours that sets each: given again in
# --vllm-args they would silently contradict the printed URL, bench command or draft_tensor_parallel_size.
_TP_REASON = "the draft's draft_tensor_parallel_size must equal it"
_OWN_FLAGS = {
    "--host": ("--host", "the printed URL and bench command follow it"),
    "--port": ("--port", "the printed URL and bench command follow it"),
    "--tensor-parallel-size": ("--tp", _TP_REASON),
    "-tp": ("--tp", _TP_REASON),
}
_MAX_MODEL_LEN = "--max-model-len"
_SERVED_NAME = "--served-model-name"
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


@dataclass(frozen=True)
class VllmSettings:
    k: int = DEFAULT_K
    tp: int = 1  # the target's --tensor-parallel-size
    draft_tp: int | None = None  # None: the same as tp, the only value vLLM accepts for a draft model
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_model_len: int | None = None  # a preset's num_ctx; --max-model-len in extra_args wins
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
    served_name: str  # the model name that API answers to (--served-model-name, else the repository)
    warnings: tuple[str, ...] = ()  # a pair or K that runs but is unlikely to be what was meant

    @property
    def shell(self) -> str:
        return shlex.join(self.argv)

    @property
    def bench(self) -> str:
        """The command that measures the server like any OpenAI-compatible one."""
        return shlex.join(["ollama-spec", "bench", self.served_name, "--url", self.url])


def build_command(target: HfModel, draft: HfModel, settings: VllmSettings = VllmSettings()) -> VllmCommand:
    """The `vllm serve` command line for the pair; refuses what vLLM would refuse after loading."""
    draft_tp = _draft_tp(settings)
    _check_extra_args(settings.extra_args)
    host = _bare_host(settings.host)
    pair = check_pair(target, draft)
    config = {
        "method": "draft_model",
        "model": draft.repo,
        "num_speculative_tokens": settings.k,
        "draft_tensor_parallel_size": draft_tp,
    }
    min_version = DRAFT_MODEL_VERSION
    if not pair.same_vocab_size:
        config["use_heterogeneous_vocab"] = True
        min_version = HETEROGENEOUS_VOCAB_VERSION
    given = _flags(settings.extra_args)
    max_model_len = (
        (_MAX_MODEL_LEN, str(settings.max_model_len))
        if (settings.max_model_len and _MAX_MODEL_LEN not in given)
        else ()
    )
    argv = (
        "vllm",
        "serve",
        target.repo,
        "--tensor-parallel-size",
        str(settings.tp),
        "--host",
        host,
        "--port",
        str(settings.port),
        *max_model_len,
        "--speculative-config",
        json.dumps(config),
        *settings.extra_args,
    )
    served = _served_name(settings.extra_args) or target.repo
    notes = _notes(target, draft, pair, settings.tp)
    return VllmCommand(
        target,
        draft,
        config,
        argv,
        min_version,
        notes,
        _url(host, settings.port),
        served,
        _warnings(target, draft, settings.k),
    )


def _draft_tp(settings: VllmSettings) -> int:
    """The draft's tensor-parallel size; InvalidSetting for a K, a --tp or a --draft-tp vLLM refuses."""
    if settings.k < 1:
        raise InvalidSetting(f"-k must be at least 1, got {settings.k}")
    if settings.tp < 1:
        raise InvalidSetting(f"--tp must be at least 1, got {settings.tp}")
    draft_tp = settings.tp if settings.draft_tp is None else settings.draft_tp
    if draft_tp != settings.tp:
        raise InvalidSetting(
            f"vLLM runs a draft model only with the target's tensor-parallel size: --draft-tp "
            f"{draft_tp} with --tp {settings.tp} is refused (vLLM 0.15 to 0.33); drop --draft-tp"
        )
    return draft_tp


def _notes(target: HfModel, draft: HfModel, pair: PairCheck, tp: int) -> tuple[str, ...]:
    """What the user should know before running the command: vocabularies, gated repos, the weights."""
    notes = [*target.notes, *draft.notes]
    if not pair.same_vocab_size:
        notes.append(
            f"the vocabularies are the same but config.json pads them differently ({target.vocab_size:,} "
            f"vs {draft.vocab_size:,}): use_heterogeneous_vocab maps the shared tokens, and vLLM then "
            "drafts greedily (still exact)"
        )
    elif not pair.known:
        notes.append("vLLM checks that the two vocabularies match when it loads them")
    gated = sorted({m.repo.split("/")[0] for m in (target, draft) if m.gated})
    if gated:
        notes.append(
            f"{', '.join(gated)} repositories are gated: accept the license on huggingface.co and set HF_TOKEN"
        )
    weights = _weights_note(target, draft, tp)
    if weights:
        notes.append(weights)
    return tuple(notes)


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
        result = subprocess.run(
            [*launcher, "--version"], capture_output=True, text=True, timeout=VERSION_TIMEOUT_S, check=False
        )
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
        raise VllmUnavailable(
            f"vLLM is not installed here: {INSTALL_HINT.format(version_text(min_version))}, "
            "or run the printed command on the machine that has it"
        )
    version = installed_version(launcher)
    if version < min_version:
        raise VllmUnavailable(
            f"vLLM {version_text(version)} ({launcher[0]}) is too old: this command needs vLLM >= "
            f"{version_text(min_version)} (0.10 to 0.14 refuse draft models); "
            f"pip install -U 'vllm>={version_text(min_version)}'"
        )
    return launcher


def exec_vllm(command: VllmCommand, launcher: list[str]) -> NoReturn:
    """Replace this process with `vllm serve ...` (signals and the exit status are vLLM's own)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(launcher[0], [*launcher, *command.argv[1:]])


def _flag(arg: str) -> str:
    """The option an argument names, spelled as vLLM's help does (vLLM takes `_` for `-` too)."""
    return arg.split("=", 1)[0].replace("_", "-") if arg.startswith("-") else ""


def _flags(args: tuple[str, ...]) -> set[str]:
    return {_flag(arg) for arg in args} - {""}


def _check_extra_args(args: tuple[str, ...]) -> None:
    for arg in args:
        flag, spelled = _flag(arg), arg.split("=", 1)[0]
        if flag in _SPECULATION_FLAGS:
            raise InvalidSetting(
                f"{spelled} in the extra vLLM arguments: this command writes "
                "--speculative-config itself (--speculative-model and --num-speculative-tokens "
                "are gone from current vLLM)"
            )
        if flag in _OWN_FLAGS:
            ours, reason = _OWN_FLAGS[flag]
            raise InvalidSetting(
                f"{spelled} in the extra vLLM arguments: this command writes it itself; give {ours} instead ({reason})"
            )


def _served_name(args: tuple[str, ...]) -> str | None:
    """The first --served-model-name (vLLM answers to each name it is given; a client may send any)."""
    for i, arg in enumerate(args):
        if _flag(arg) == _SERVED_NAME:
            if "=" in arg:
                return arg.split("=", 1)[1] or None
            following = args[i + 1] if i + 1 < len(args) else ""
            return following if following and not following.startswith("-") else None
    return None


def _bare_host(host: str) -> str:
    """`[::1]` as vLLM's --host takes it (`::1`); the URL brackets it again."""
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if "[" in bare or "]" in bare:
        raise InvalidSetting(f"--host '{host}' is not an address: give an IPv6 address as ::1 or [::1]")
    return bare


def _warnings(target: HfModel, draft: HfModel, k: int) -> tuple[str, ...]:
    found = []
    if target.repo.lower() == draft.repo.lower():
        found.append(
            f"the draft is the target itself ({target.repo}): every draft is accepted, but each step "
            "runs the full model K more times, so it is slower than the target alone"
        )
    elif target.parameters is not None and draft.parameters is not None and draft.parameters >= target.parameters:
        found.append(
            f"the draft ({draft.parameters:g}B) is not smaller than the target ({target.parameters:g}B): "
            "speculation only pays with a much smaller draft"
            + ("; swap TARGET and --draft?" if draft.parameters > target.parameters else "")
        )
    if k > LARGE_K:
        found.append(
            f"-k {k}: vLLM drafts all {k} tokens every step, and past {LARGE_K} "
            f"the later ones are rarely accepted, so their draft passes are wasted ({DEFAULT_K} is the "
            "usual)"
        )
    return tuple(found)


def _url(host: str, port: int) -> str:
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"  # where a client on this machine reaches a server bound to every interface
    return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"


def _weights_note(target: HfModel, draft: HfModel, tp: int) -> str | None:
    if target.parameters is None or draft.parameters is None:
        return None
    total = (target.parameters + draft.parameters) * 1e9 * BF16_BYTES / 2**30
    per_gpu = f", {total / tp:.0f} GiB on each of {tp} GPUs" if tp > 1 else " on the GPU"
    return (
        f"BF16 weights: about {total:.0f} GiB for the pair{per_gpu}, before the KV cache (vLLM takes 90 % of "
        "each GPU by default); a quantized repository (AWQ, GPTQ, FP8) as TARGET needs less"
    )
