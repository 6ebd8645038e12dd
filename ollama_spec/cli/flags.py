"""A command's parsed options as one frozen value, each option a field named as click names it.

A command with many options takes them as one `Flags` dataclass (`@into(GenerateFlags)` right above the
`def`): it reads `flags.max_tokens`, typed and named, and its body stays short. The groups several
commands share (speculation, sampling, placement, loading) are dataclasses of their own that a command's
flags inherit, next to the decorators in options.py that declare them. `settings` still reads the same
values through `Options`, with where each came from.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any


def into(flags_type: type):
    """Hand a click command its parsed options as one `flags_type`, after the context if it takes one.

    The dataclass must name every option the command declares, and nothing else: a mismatch (an option
    added without its field) fails on the command's first run, which every command's tests make.
    """
    names = frozenset(field.name for field in fields(flags_type))

    def decorate(function):
        @functools.wraps(function)
        def command(*args, **params):
            if params.keys() != names:
                differ = sorted(params.keys() ^ names)
                raise TypeError(f"{function.__name__}'s options and {flags_type.__name__} differ: {differ}")
            return function(*args, flags_type(**params))

        command.flags_type = flags_type  # for the test that holds each command's options to its fields
        return command

    return decorate


@dataclass(frozen=True)
class SpeculationFlags:
    """--draft, -k, --draft-p-min, --ngram-size, --ngram (options.speculation_options)."""

    draft: str | None
    k: int | None  # None: auto
    draft_p_min: float
    ngram_size: int
    with_ngram: bool


@dataclass(frozen=True)
class SamplingFlags:
    """--temperature, --top-k, --top-p, --min-p, --seed and the penalties (options.sampling_options)."""

    temperature: float | None
    top_k: int | None
    top_p: float | None
    min_p: float | None
    seed: int | None
    repeat_penalty: float | None
    repeat_last_n: int | None
    presence_penalty: float | None
    frequency_penalty: float | None


@dataclass(frozen=True)
class PlacementFlags:
    """--rpc, --tensor-split, --split-mode, --main-gpu (options.placement_options)."""

    rpc: str | None
    tensor_split: str | None
    split_mode: str | None
    main_gpu: int | None


@dataclass(frozen=True)
class LoadingFlags(PlacementFlags):
    """How the pair loads (options.loading_options)."""

    n_gpu_layers: int | None
    draft_n_gpu_layers: int
    threads: int | None
    kv_type: str
    no_check: bool
    repack: bool | None
    flash_attn: str


@dataclass(frozen=True)
class RunFlags(LoadingFlags, SamplingFlags, SpeculationFlags):
    """What generate, chat and serve share: TARGET, -f, the speculation, sampling and loading options,
    --ctx, --verbose and --models-dir."""

    target: str | None
    preset: Any  # models.modelfile.Modelfile, or None
    ctx: int | None
    verbose: bool
    models_dir: str | None
