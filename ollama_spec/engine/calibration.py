"""Measure what a draft step and target batches of 1..K+1 tokens cost on this machine, once per pair.

`-k auto` needs the verify cost of every batch size it might choose, and those depend on the
device, the backend and the thread count far more than on anything in the model files. They
take a second or two to measure on the loaded pair, and are cached per pair and machine setup
(`$XDG_CACHE_HOME/ollama-spec/step-costs.json`) so later runs start drafting at once.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from ollama_spec.config import cache_dir
from ollama_spec.decoding.acceptance import MARGIN_EDGES
from ollama_spec.decoding.proposer_table import NGRAM
from ollama_spec.decoding.proposers import Model
from ollama_spec.decoding.step_costs import StepCosts
from ollama_spec.llama.model import LLAMA_CPP_VERSION

CALIBRATION_REPEATS = 5
CALIBRATION_DEPTH = 256  # tokens already in the cache when steps are timed: a typical mid-answer position


# Every batch size up to this one is timed (every K that -k auto may choose by default); past it,
# for a larger --max-speculative-tokens, every few sizes, with the sizes between interpolated. Each
# size is timed, not drawn from a curve: llama.cpp's kernels have bumps (on a 2-core CPU a batch of
# 9 costs less than one of 8), and a K chosen from an extrapolated cost can be far off (K=16 where
# the measured speed peaks at K=5).
DENSE_UP_TO = 17
SPARSE_STEP = 4


def batch_sizes_to_time(largest: int) -> list[int]:
    """The verify batch sizes timed for batches of 1..largest tokens (always including largest)."""
    sizes = list(range(1, min(largest, DENSE_UP_TO) + 1))
    sizes += range(DENSE_UP_TO + SPARSE_STEP, largest, SPARSE_STEP)
    return sorted({*sizes, largest})


def measure_step_costs(
    target: Model,
    draft: Model | None,
    k_max: int,
    context: Sequence[int],
    repeats: int = CALIBRATION_REPEATS,
    *,
    every_size: bool = False,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> StepCosts:
    """Median seconds of one draft step and of target batches of 1..k_max+1 tokens after `context`
    (`every_size`: all timed, as a benchmark reports them; else some interpolated). `progress(done,
    total)` after each timed step, outside its timing (a long calibration says how far it is).

    The measurements go round-robin, so a busy moment on a shared machine skews none of them alone.
    Both caches are emptied afterwards. Without a draft model (n-gram lookup) drafting is free.
    """
    context = list(context)
    token = context[-1]
    models = [m for m in (target, draft) if m is not None]
    for model in models:
        model.truncate(0)
        model.eval(context)
    sizes = list(range(1, k_max + 2)) if every_size else batch_sizes_to_time(k_max + 1)
    steps = [(draft, lambda: draft.eval([token]))] if draft is not None else []
    steps += [(target, lambda n=n: target.eval([token] * n, logits="all")) for n in sizes]
    times: list[list[float]] = [[] for _ in steps]
    total = repeats * len(steps)
    for repeat in range(repeats):
        for i, ((model, step), samples) in enumerate(zip(steps, times)):
            start = time.perf_counter()
            step()
            samples.append(time.perf_counter() - start)
            model.truncate(len(context))
            progress(repeat * len(steps) + i + 1, total)
    for model in models:
        model.truncate(0)  # the next request must not find the filler in the cache
    medians = [statistics.median(samples) for samples in times]
    if draft is None:
        medians.insert(0, 0.0)
    verify = np.interp(np.arange(1, k_max + 2), sizes, medians[1:])
    return StepCosts(draft_step_s=medians[0], verify_s=tuple(float(v) for v in verify))


def calibration_context(n_ctx: int, k_max: int, filler: Sequence[int]) -> list[int]:
    """`filler` repeated to CALIBRATION_DEPTH tokens (less in a small context)."""
    depth = max(1, min(CALIBRATION_DEPTH, n_ctx - k_max - 2))
    return (list(filler) * (depth // max(len(filler), 1) + 1))[:depth]


class StepCostCache:
    """Step costs per pair and machine setup, in one small JSON file."""

    def __init__(self, path: Path | None = None):
        self.path = path or cache_dir() / "step-costs.json"
        # the file as last parsed, and the (inode, mtime, size) it was parsed at: each request asks for
        # its pair's costs and acceptance, and parsing the file each time cost a short request ~1 ms
        self._parsed: dict = {}
        self._parsed_at: tuple[int, int, int] | None = None

    def get(self, key: str) -> StepCosts | None:
        """The costs as calibrated."""
        return self._costs(key, "")

    def put(self, key: str, costs: StepCosts) -> None:
        """A new calibration: the costs runs learned from an older one go with it."""
        entries = self._read()
        entry = entries.get(key) if isinstance(entries.get(key), dict) else {}
        entries[key] = {name: value for name, value in entry.items() if not name.startswith("learned_")} | {
            "draft_step_s": costs.draft_step_s,
            "verify_s": list(costs.verify_s),
        }
        self._write(entries)

    def forget(self, key: str) -> None:
        """The calibration goes: the next run times the steps again (and that drops what was learned
        beside this one). The rest of the entry stays."""
        entries = self._read()
        entry = entries.get(key)
        if isinstance(entry, dict):
            entries[key] = {name: value for name, value in entry.items() if name not in ("draft_step_s", "verify_s")}
            self._write(entries)

    def get_learned(self, key: str) -> StepCosts | None:
        """The costs as the last run refined them from its steps (AutoK's line)."""
        return self._costs(key, "learned_")

    def put_learned(self, key: str, costs: StepCosts) -> None:
        self._update(key, {"learned_draft_step_s": costs.draft_step_s, "learned_verify_s": list(costs.verify_s)})

    def _costs(self, key: str, prefix: str) -> StepCosts | None:
        entry = self._read().get(key)
        try:
            return StepCosts(entry[f"{prefix}draft_step_s"], tuple(entry[f"{prefix}verify_s"]))
        except (TypeError, KeyError, ValueError):
            return None  # absent, or written by another version: measure again

    def get_acceptance(self, key: str) -> tuple[float, ...] | None:
        """The pair's acceptance by margin band, as a last run learned it (k_policy.MARGIN_EDGES)."""
        entry = self._read().get(key)
        try:
            bands = tuple(float(a) for a in entry["acceptance_by_margin"])
        except (TypeError, KeyError, ValueError):
            return None
        return bands if len(bands) == len(MARGIN_EDGES) + 1 and all(0 <= a <= 1 for a in bands) else None

    def put_acceptance(self, key: str, bands: Sequence[float]) -> None:
        self._update(key, {"acceptance_by_margin": [round(a, 4) for a in bands]})

    def get_flash_attention(self, key: str) -> tuple[str, dict] | None:
        """Flash attention "on" or "off" as timed for a model and setup (engine/flash_choice.py), and the
        timings it was chosen from."""
        entry = self._read().get(key)
        if not isinstance(entry, dict) or entry.get("flash_attention") not in ("on", "off"):
            return None
        timings = entry.get("flash_attention_timings_s")
        return entry["flash_attention"], timings if isinstance(timings, dict) else {}

    def put_flash_attention(self, key: str, choice: str, timings: dict) -> None:
        """The choice, and the timings (seconds by kind) it was made from, for a person to read."""
        self._update(key, {"flash_attention": choice, "flash_attention_timings_s": timings})

    def _update(self, key: str, fields: dict) -> None:
        entries = self._read()
        entry = entries.get(key)
        entries[key] = (entry if isinstance(entry, dict) else {}) | fields
        self._write(entries)

    def _write(self, entries: dict) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            staged = self.path.with_suffix(f".{os.getpid()}.tmp")
            staged.write_text(json.dumps(entries, indent=1))
            staged.replace(self.path)  # atomic: a concurrent reader sees the old file or the new one
        except OSError:
            pass  # a read-only home only costs a calibration next time

    def _read(self) -> dict:
        """The file's entries: parsed again only when it changed (a write replaces it: a new inode), and
        a copy, which callers may change before they write it."""
        try:
            stat = self.path.stat()
            stamp = (stat.st_ino, stat.st_mtime_ns, stat.st_size)
            if stamp != self._parsed_at:
                data = json.loads(self.path.read_text())
                self._parsed, self._parsed_at = (data if isinstance(data, dict) else {}), stamp
        except (OSError, ValueError):
            return {}
        return dict(self._parsed)


def cost_key(target: Path, draft: Path | None, **setup) -> str:
    """Which pair, on which llama.cpp build and setup (threads, layers on the GPU, KV type...)."""
    parts = [_describe(target), _describe(draft) if draft else NGRAM, f"llama_cpp={LLAMA_CPP_VERSION}"]
    parts += [f"{name}={value}" for name, value in sorted(setup.items())]
    return " ".join(parts)


def model_key(purpose: str, model: Path, **setup) -> str:
    """What one model's measurement (`purpose`) was taken for: which file, on which build and setup."""
    parts = [purpose, _describe(model), f"llama_cpp={LLAMA_CPP_VERSION}"]
    parts += [f"{name}={value}" for name, value in sorted(setup.items())]
    return " ".join(parts)


def _describe(path: Path) -> str:
    try:
        return f"{path.name}:{path.stat().st_size}"
    except OSError:
        return path.name
