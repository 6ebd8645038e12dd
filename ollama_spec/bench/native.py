"""A reference row from llama.cpp's own speculative loop, `llama-speculative-simple`.

Built from the same vendored llama.cpp as llama-cpp-python (scripts/build-native-speculative.sh),
run on the same GGUF blobs, prompts, K, threads and context, greedy: what our Python loop costs
over llama.cpp's C++ one. For comparison only; `bench --native PATH` adds it. A draft model drafts as
`draft-simple`, an EAGLE-3 head as `draft-eagle3` and the target's own MTP (NextN) layers (no draft: bench
-d mtp) as `draft-mtp`, which llama.cpp drafts with from the target's GGUF alone.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from pathlib import Path

from ollama_spec.bench.prompts import Prompt
from ollama_spec.bench.runner import Progress, RowTimer
from ollama_spec.bench.samples import NATIVE, Row, Sample
from ollama_spec.bench.settings import BenchSettings
from ollama_spec.errors import InvalidSetting
from ollama_spec.llama.load_params import choose_flash_attention, default_threads
from ollama_spec.models.heads import is_head
from ollama_spec.models.resolve import ResolvedModel

NATIVE_TIMEOUT_S = 600
NATIVE_TRIES = 3  # runs of one prompt that may end without llama.cpp's report (see _report)
_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_ENCODED = re.compile(r"encoded\s+(\d+) tokens in\s+([\d.]+) seconds")
_COUNT = {name: re.compile(rf"{name}\s*=\s*(\d+)") for name in ("n_drafted", "n_accept")}


def run_native_row(
    binary: Path,
    target: ResolvedModel,
    draft: ResolvedModel | None,
    k: int,
    prompts: Sequence[Prompt],
    prompt_texts: dict[str, str],
    settings: BenchSettings,
    progress: Progress = lambda label: None,
) -> Row:
    """Time each prompt with `llama-speculative-simple` at draft length k; tok/s as llama.cpp reports it."""
    row, timer = native_row(binary, target, draft, k, prompt_texts, settings)
    for run in range(settings.runs):
        for prompt in prompts:
            row.samples.append(timer(prompt, settings.max_tokens, run))
            progress(f"{row.label} · {prompt.name}")
    return row


def native_row(
    binary: Path,
    target: ResolvedModel,
    draft: ResolvedModel | None,
    k: int,
    prompt_texts: dict[str, str],
    settings: BenchSettings,
) -> tuple[Row, RowTimer]:
    """The native row and what times it on one prompt, for a phase that interleaves it with others."""
    check_native(binary, settings, target, draft)

    def run(prompt: Prompt, max_tokens: int, run: int) -> Sample:
        return _run(binary, target, draft, k, prompt.name, prompt_texts[prompt.name], settings, run, max_tokens)

    return Row(f"llama.cpp speculative-simple K={k}", NATIVE, k), run


def check_native(binary: Path, settings: BenchSettings, target: ResolvedModel, draft: ResolvedModel | None) -> None:
    """Refuse --native before anything is timed: a missing binary, a sampled run or LoRA adapters."""
    if target.adapters or (draft and draft.adapters):  # its --lora would go to the draft as well as the target
        raise InvalidSetting(
            "--native runs models without LoRA adapters: leave it out for a model with an adapter layer"
        )
    if not binary.is_file():
        raise InvalidSetting(f"--native {binary} does not exist: build it with scripts/build-native-speculative.sh")
    if not settings.greedy:
        raise InvalidSetting("--native compares greedy runs only (llama-speculative-simple samples differently)")


def _run(
    binary: Path,
    target: ResolvedModel,
    draft: ResolvedModel | None,
    k: int,
    name: str,
    text: str,
    settings: BenchSettings,
    run: int,
    max_tokens: int,
) -> Sample:
    log = _report(binary, _command(binary, target, draft, k, text, settings, max_tokens), name)
    decoded, encoded = _DECODED.search(log), _ENCODED.search(log)
    n, decode_s = int(decoded.group(1)), float(decoded.group(2))
    encode_s = float(encoded.group(2)) if encoded else 0.0
    counts = {key: int(m.group(1)) for key, pattern in _COUNT.items() if (m := pattern.search(log))}
    # Only counts and times come back, not token ids: the row is timed, never compared token by token.
    return Sample(
        name,
        run,
        [-1] * (n + 1),
        encode_s,
        encode_s + decode_s,
        drafted=counts["n_drafted"],
        accepted=counts["n_accept"],
    )


def _report(binary: Path, command: list[str], name: str) -> str:
    """The log of a run that ended with its report. llama.cpp's logger thread now and then loses the
    report at exit (exit status 0, the run itself fine): such a run is made again, NATIVE_TRIES times
    in all."""
    for _ in range(NATIVE_TRIES):
        try:
            # it prints the text a token piece at a time: a piece may end inside a character
            done = subprocess.run(
                command, capture_output=True, text=True, errors="replace", timeout=NATIVE_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise InvalidSetting(f"{binary.name} took over {NATIVE_TIMEOUT_S} s on prompt '{name}'") from None
        log = done.stdout + done.stderr
        last = (log.strip().splitlines() or ["no output"])[-1]
        if done.returncode != 0:
            raise InvalidSetting(f"{binary.name} failed on prompt '{name}' (exit {done.returncode}): {last}")
        if _DECODED.search(log) and all(pattern.search(log) for pattern in _COUNT.values()):
            return log
    raise InvalidSetting(
        f"{binary.name} ended without its report on prompt '{name}' in {NATIVE_TRIES} runs (exit 0): {last}"
    )


def _command(
    binary: Path,
    target: ResolvedModel,
    draft: ResolvedModel | None,
    k: int,
    text: str,
    settings: BenchSettings,
    max_tokens: int,
) -> list[str]:
    threads = str(settings.n_threads or default_threads())
    return [
        str(binary),
        "-m",
        str(target.path),
        *(("-md", str(draft.path)) if draft is not None else ()),
        "--spec-type",
        _spec_type(draft),
        "--spec-draft-n-max",
        str(k),
        "-p",
        text,
        "-n",
        str(max_tokens),
        "--ignore-eos",
        "--temp",
        "0",
        "--seed",
        str(settings.seed),
        "-c",
        str(settings.context),
        "-t",
        threads,
        "-ngl",
        "99",
        "--spec-draft-ngl",
        "99",
        "--flash-attn",
        {"off": "off", "on": "on"}.get(choose_flash_attention(settings.flash_attention), "auto"),
    ]


def _spec_type(draft: ResolvedModel | None) -> str:
    """llama.cpp's spec type for `draft` (None: the target's own MTP layers); a head is never auto-detected."""
    if draft is None:
        return "draft-mtp"
    return "draft-eagle3" if is_head(draft.info) else "draft-simple"
