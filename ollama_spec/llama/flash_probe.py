"""Time a model's verify-shaped batches with llama.cpp's flash attention on and off, in two throw-away
contexts over weights loaded once: a context's flash attention is fixed when it is made, so the one a
model keeps is made after the choice (engine/flash_choice.py)."""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path
from time import perf_counter

from ollama_spec.llama.loading import LoadSettings, Weights
from ollama_spec.llama.model import LoadedModel

FLASH_KINDS = ("on", "off")


def time_flash_attention(
    path: Path, weights: Weights, settings: LoadSettings, text: str, width: int, depth: int, repeats: int
) -> dict[str, tuple[float, float]]:
    """Median seconds, by flash attention "on" and "off", of a batch of `width` tokens in one sequence and
    of one in each of the `settings.n_seq` sequences, each sequence `depth` tokens deep (`text`'s tokens,
    repeated). The measurements go round-robin, so a busy moment on a shared machine skews neither kind
    alone. Only sequence 0 is read; the others take a copy of its cells."""
    n_ctx = depth + width
    probes: dict[str, LoadedModel] = {}
    try:
        for kind in FLASH_KINDS:
            probe_settings = replace(settings, n_ctx=n_ctx, flash_attention=kind)
            probes[kind] = LoadedModel(path, probe_settings, weights, borrowed=True)
        some = probes[FLASH_KINDS[0]]
        filler = some.tokenize(text, add_bos=some.add_bos, special=False) or [some.bos_token]
        context = (filler * (depth // len(filler) + 1))[:depth]
        for probe in probes.values():
            probe.eval(context)
            cells = probe.save_sequence(0)
            for seq in range(1, probe.n_seq):
                probe.restore_sequence(seq, cells, context)
        token = context[-1]
        shapes = (1, settings.n_seq)
        times: dict[tuple[str, int], list[float]] = {(kind, n): [] for kind in probes for n in shapes}
        for _ in range(repeats):
            for kind, probe in probes.items():
                for n in shapes:
                    start = perf_counter()
                    probe.decode_many([(seq, [token] * width, width) for seq in range(n)])
                    times[kind, n].append(perf_counter() - start)
                    for seq in range(n):
                        probe.truncate(depth, seq)
        return {kind: tuple(statistics.median(times[kind, n]) for n in shapes) for kind in probes}
    finally:
        for probe in probes.values():
            probe.close()
