"""Flash attention for a pair where "auto" is for a timing to settle (llama/load_params.MEASURE: the CPU,
several slots): the target's weights load once, a lone slot's verify batch and every slot's are timed in
throw-away contexts with it on and off, and the target's own context is made with the kind the timings
choose (llama/load_params.flash_attention_from_timings). The choice is cached per model and setup
beside the step costs, so it is timed once."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ollama_spec.engine.calibration import CALIBRATION_DEPTH, StepCostCache, model_key
from ollama_spec.engine.cpu_wait import CpuWait
from ollama_spec.llama.flash_probe import time_flash_attention
from ollama_spec.llama.load_params import MEASURE, default_threads, flash_attention_from_timings
from ollama_spec.llama.loading import load_weights
from ollama_spec.llama.model import LoadedModel, LoadSettings
from ollama_spec.llama.threads import apart

# What the timed batches read after: ordinary text (only its length matters).
PROBE_TEXT = "The quick brown fox jumps over the lazy dog while the sun sets slowly over the hills. "
# A verify batch of K=3: the middle of what -k auto runs on a CPU. Its shapes, not its K, tell the kinds apart.
PROBE_WIDTH = 4
# Each shape timed this often with each kind (round-robin), the median kept: a tiny pair's passes take
# under a millisecond, the demo pair's 4-slot batch ~0.3 s on a 2-core CPU. The third round is left out
# where the first two already fix the choice that the medians of three would make.
PROBE_REPEATS = 3


@dataclass(frozen=True)
class FlashChoice:
    """The kind a model loads with ("on", "off", or "auto": llama.cpp's) and, where it was timed, how it
    was chosen, in words."""

    kind: str
    why: str = ""

    def __str__(self) -> str:
        kind = "llama.cpp's choice" if self.kind == "auto" else self.kind
        return f"{kind} ({self.why})" if self.why else kind


def load_target(
    path: Path, settings: LoadSettings, notice: Callable[[str], None], cache: StepCostCache | None = None
) -> tuple[LoadedModel, FlashChoice]:
    """The target loaded with `settings`, and its flash attention: timed both ways first where the settings
    say MEASURE (or as timed before, from the cache), else as they say."""
    if settings.flash_attention != MEASURE:
        return LoadedModel(path, settings), FlashChoice(settings.flash_attention, "")
    weights = load_weights(path, settings)
    try:
        choice = choose_by_timing(path, weights, settings, notice, cache or StepCostCache())
        return LoadedModel(path, replace(settings, flash_attention=choice.kind), weights), choice
    except BaseException:
        weights.close()
        raise


def choose_by_timing(path: Path, weights, settings: LoadSettings, notice, cache: StepCostCache) -> FlashChoice:
    """The kind as cached for this model and setup, else timed now (and cached)."""
    cached = cached_choice(path, settings, cache)
    if cached is not None:
        return cached
    key = flash_key(path, settings)
    notice(f"timing flash attention on and off for {settings.n_seq} slots (once per model and setup, then cached)")
    depth = max(1, min(CALIBRATION_DEPTH, settings.n_ctx - PROBE_WIDTH))
    with CpuWait() as wait:  # apart: no OpenMP team left behind on the loading thread (llama/threads.py)
        timings = apart(
            lambda stop: time_flash_attention(
                path,
                weights,
                settings,
                PROBE_TEXT,
                PROBE_WIDTH,
                depth,
                PROBE_REPEATS,
                decide=flash_attention_from_timings,
            )
        )
    kind = flash_attention_from_timings(timings["on"], timings["off"])
    if wait.busy:  # a busy spell tips a close pair (the demo target's ~1.0) either way: timed again next load
        return FlashChoice(kind, f"{describe(timings, settings.n_seq)}; the machine was busy ({wait}): not cached")
    cache.put_flash_attention(key, kind, {name: list(seconds) for name, seconds in timings.items()})
    return FlashChoice(kind, describe(timings, settings.n_seq))


def cached_choice(path: Path, settings: LoadSettings, cache: StepCostCache | None = None) -> FlashChoice | None:
    """The kind timed before for this model and setup (`check` says it), or None."""
    cached = (cache or StepCostCache()).get_flash_attention(flash_key(path, settings))
    if cached is None:
        return None
    kind, timings = cached
    try:
        return FlashChoice(kind, f"{describe(timings, settings.n_seq)}, cached")
    except (KeyError, TypeError, ValueError):
        return FlashChoice(kind, "as timed before, cached")


def describe(timings: dict, n_seq: int) -> str:
    """The timings a choice was made from, in words."""
    (lone_on, full_on), (lone_off, full_off) = timings["on"], timings["off"]
    return (
        f"timed: a {PROBE_WIDTH}-token verify batch {lone_on * 1e3:.2f} ms on, {lone_off * 1e3:.2f} ms off; "
        f"in all {n_seq} slots {full_on * 1e3:.2f} ms on, {full_off * 1e3:.2f} ms off"
    )


def flash_key(path: Path, settings: LoadSettings) -> str:
    """The cache key of the choice: the model, and what its passes' cost depends on."""
    setup = {
        "threads": settings.n_threads or default_threads(),
        "slots": settings.n_seq,
        "gpu_layers": settings.n_gpu_layers,
        "kv_type": settings.kv_type,
        "repack": settings.use_extra_bufts,
        "isolated": settings.isolated_rows,
    }
    if not settings.placement.is_default:
        setup["placement"] = settings.placement
    if settings.lora_adapters:
        setup["adapters"] = ",".join(str(p) for p in settings.lora_adapters)
    return model_key("flash_attention", path, **setup)
