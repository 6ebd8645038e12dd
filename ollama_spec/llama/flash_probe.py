"""Time a model's verify-shaped batches with llama.cpp's flash attention on and off, in two throw-away
contexts over weights loaded once: a context's flash attention is fixed when it is made, so the one a
model keeps is made after the choice (engine/flash_choice.py)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from time import perf_counter

from ollama_spec.llama.loading import LoadSettings, Weights
from ollama_spec.llama.model import LoadedModel
from ollama_spec.llama.saved_cells import read_saved_cells

FLASH_KINDS = ("on", "off")
# Tokens the probe reads (one verify-sized pass); the cells of the rest of its depth repeat theirs
# (saved_cells.py): a pass's cost depends on how many cells it attends over, not on what they hold (the
# tiny target's passes over 4 cells repeated to 256, over 16 and over 256 read: alike within 3 %), and
# reading the demo target's 256 tokens in each kind took 5-8 s apiece on a 2-core CPU
READ_CELLS = 4

Decide = Callable[[Sequence[float], Sequence[float]], str]


def time_flash_attention(
    path: Path,
    weights: Weights,
    settings: LoadSettings,
    text: str,
    width: int,
    depth: int,
    repeats: int,
    decide: Decide | None = None,
) -> dict[str, tuple[float, float]]:
    """Median seconds, by flash attention "on" and "off", of a batch of `width` tokens in one sequence and
    of one in each of the `settings.n_seq` sequences, each sequence `depth` tokens deep (`text`'s tokens,
    repeated). The measurements go round-robin, so a busy moment on a shared machine skews neither kind
    alone; they stop before `repeats` rounds where `decide(on, off)` (the shapes' medians, a kind) comes out
    the same whatever the rounds left would time (`settled`)."""
    n_ctx = depth + width
    probes: dict[str, LoadedModel] = {}
    try:
        for kind in FLASH_KINDS:
            probe_settings = replace(settings, n_ctx=n_ctx, flash_attention=kind)
            probes[kind] = LoadedModel(path, probe_settings, weights, borrowed=True)
        some = probes[FLASH_KINDS[0]]
        filler = some.tokenize(text, add_bos=some.add_bos, special=False) or [some.bos_token]
        context = (filler * (depth // len(filler) + 1))[:depth]
        fill(probes, context)
        token = context[-1]
        shapes = (1, settings.n_seq)
        times: dict[str, list[list[float]]] = {kind: [[] for _ in shapes] for kind in probes}
        for _ in range(repeats):
            for kind, probe in probes.items():
                for n, samples in zip(shapes, times[kind]):
                    start = perf_counter()
                    probe.decode_many([(seq, [token] * width, width) for seq in range(n)])
                    samples.append(perf_counter() - start)
                    for seq in range(n):
                        probe.truncate(depth, seq)
            if decide is not None and settled(decide, times["on"], times["off"], repeats):
                break
        return {kind: tuple(statistics.median(samples) for samples in times[kind]) for kind in probes}
    finally:
        for probe in probes.values():
            probe.close()


def fill(probes: dict[str, LoadedModel], context: list[int]) -> None:
    """Every sequence of every probe holding `context`'s cells: READ_CELLS of its tokens read once, their
    cells repeated to its depth and written into each, in each kind's V layout (transposed without flash
    attention: llama.cpp's v_trans). A probe that does not take them reads `context` itself."""
    first = next(iter(probes.values()))
    first.eval(context[:READ_CELLS])
    saved = read_saved_cells(first.save_sequence(0))
    for kind, probe in probes.items():
        cells = saved.deepened(len(context), v_trans=kind == "off") if saved is not None else None
        if cells is None or not all(probe.restore_sequence(seq, cells, context) for seq in range(probe.n_seq)):
            for seq in range(probe.n_seq):
                probe.clear_sequence(seq)
            probe.eval(context)
            cells = probe.save_sequence(0)
            for seq in range(1, probe.n_seq):
                probe.restore_sequence(seq, cells, context)


def settled(decide: Decide, on: Sequence[Sequence[float]], off: Sequence[Sequence[float]], repeats: int) -> bool:
    """Whether `decide` gives one kind from every shape's median of `repeats` samples, whatever the samples
    not yet timed are: it does at both ends of the medians' ranges (`median_range`), flash attention at its
    cheapest against no flash attention at its dearest and the other way round (a rule that takes one
    kind for the more it costs relative to the other)."""
    on_ranges = [median_range(samples, repeats) for samples in on]
    off_ranges = [median_range(samples, repeats) for samples in off]
    ends = [[r[end] for r in ranges] for ranges in (on_ranges, off_ranges) for end in (0, 1)]
    if not all(math.isfinite(value) for values in ends for value in values):
        return False
    low_on, high_on, low_off, high_off = ends
    return decide(low_on, high_off) == decide(high_on, low_off)


def median_range(samples: Sequence[float], total: int) -> tuple[float, float]:
    """The least and the most the median (statistics.median's) of `total` samples can come out, `samples`
    of them known and the rest any value (-inf or inf where it can be any)."""
    known = sorted(samples)
    missing = total - len(known)
    middle = (total - 1) // 2, total // 2  # the one or two places the median averages
    least = [known[p - missing] if p >= missing else -math.inf for p in middle]
    most = [known[p] if p < len(known) else math.inf for p in middle]
    return sum(least) / 2, sum(most) / 2
