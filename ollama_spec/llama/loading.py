"""A GGUF opened in llama.cpp: its weights, one context over them with room for every sequence, its LoRA
adapters; and the settings it is opened with."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import llama_cpp
from llama_cpp._internals import LlamaContext, LlamaModel

from ollama_spec.errors import InvalidSetting, ModelLoadError
from ollama_spec.llama.load_params import (
    FLASH_ATTENTION,
    KV_TYPES,
    apply_placement,
    default_threads,
    kv_override_array,
    load_lora_adapters,
    set_lora_adapters,
)
from ollama_spec.llama.log import is_verbose, last_error, log_mark
from ollama_spec.planning.placement import Placement


@dataclass(frozen=True)
class LoadSettings:
    n_ctx: int = 4096
    n_gpu_layers: int = -1  # -1: every layer on the GPU when there is one
    n_threads: int | None = None
    n_batch: int = 512
    kv_overrides: tuple[tuple[str, str | int | float | bool], ...] = ()
    kv_type: str = "f16"  # KV cache element type: f16, q8_0 or q4_0 (quantized needs flash attention)
    # llama.cpp's extra CPU buffers (AMX, CPU_REPACK): a repacked second copy of CPU weights,
    # faster for some batch sizes, fatal on some machines (see canary.py).
    use_extra_bufts: bool = True
    # "auto" lets llama.cpp choose (it picks flash attention wherever the backend has it);
    # "off" can be faster for small verify batches deep into a context on a CPU.
    flash_attention: str = "auto"
    placement: Placement = Placement()  # RPC servers and GPU split; the default is this machine's GPUs
    # GGUF LoRA adapters applied at scale 1 over the weights, in order (Ollama's adapter layers,
    # which it passes to llama.cpp as --lora)
    lora_adapters: tuple[Path, ...] = ()
    # A sliding-window model's window layers cache only the window and a batch (the engine's
    # target, architectures.takes_window_cache), instead of every position (see `truncate`).
    window_cache: bool = False
    # Sequences in the cache, each of n_ctx tokens (serve's slots: requests that run together)
    n_seq: int = 1
    # With several sequences each has a KV stream of its own (llama-server's -np N), so a row attends
    # over its own sequence's cells only, not over every cell that other requests left in one unified
    # cache. With isolated_rows the passes are laid out so that a sequence's rows do not depend on
    # the others either (passes.py), as a target's must, whose rows are the answer. Without, a draft's:
    # padded only as llama.cpp's streams need, as few rows as can be, whose rows only choose what is
    # proposed (the target's verdict on it is the same bits either way).
    isolated_rows: bool = True
    # Load the model's MTP (NextN) layers too, for a draft context over them (mtp.py); llama.cpp
    # skips them otherwise
    load_mtp: bool = False

    def __post_init__(self) -> None:
        if self.n_seq < 1:
            raise InvalidSetting(f"--parallel must be at least 1, got {self.n_seq}")


@dataclass
class Weights:
    """A GGUF's weights in llama.cpp with its LoRA adapters: what several contexts can share (a
    throw-away one timed beside the one a model keeps: engine/flash_choice.py)."""

    model: LlamaModel
    adapters: list
    keep: tuple  # the arrays its parameters point at

    def close(self) -> None:
        for adapter in self.adapters:
            llama_cpp.llama_adapter_lora_free(adapter)
        self.adapters = []
        self.model.close()


@dataclass
class Opened:
    """llama.cpp's handles for one loaded GGUF: its weights and one context over them."""

    weights: Weights
    ctx: LlamaContext
    threads: int


def load_weights(path: Path, settings: LoadSettings) -> Weights:
    """Load `path`'s weights (and LoRA adapters); ModelLoadError with llama.cpp's own words."""
    mark = log_mark()
    model_params = llama_cpp.llama_model_default_params()
    model_params.n_gpu_layers = 0x7FFFFFFF if settings.n_gpu_layers < 0 else settings.n_gpu_layers
    model_params.use_extra_bufts = settings.use_extra_bufts
    model_params.load_mtp = settings.load_mtp
    keep = (apply_placement(model_params, settings.placement), kv_override_array(settings.kv_overrides))
    if keep[1] is not None:
        model_params.kv_overrides = keep[1]
    try:
        model = LlamaModel(path_model=str(path), params=model_params, verbose=is_verbose())
    except ValueError as exc:
        raise ModelLoadError(f"llama.cpp could not load {path}: {last_error(mark) or exc}") from None
    try:
        adapters = load_lora_adapters(model.model, settings.lora_adapters, mark, path.name)
    except ModelLoadError:
        model.close()
        raise
    return Weights(model, adapters, keep)


def open_model(path: Path, settings: LoadSettings, weights: Weights | None = None) -> Opened:
    """Load `path`'s weights (unless given: loaded before, with the same settings) and make its context;
    ModelLoadError (with llama.cpp's own words) when either fails, InvalidSetting for a combination
    llama.cpp cannot run."""
    threads = settings.n_threads or default_threads()
    ctx_params = _context_params(settings, threads)
    loaded = weights or load_weights(path, settings)
    mark = log_mark()
    try:
        ctx = LlamaContext(model=loaded.model, params=ctx_params, verbose=is_verbose())
    except ValueError:
        if weights is None:
            loaded.close()
        raise ModelLoadError(
            f"llama.cpp could not create a {settings.n_ctx}-token context for {path}: "
            f"{last_error(mark) or 'out of memory?'}"
        ) from None
    if loaded.adapters and set_lora_adapters(ctx.ctx, loaded.adapters) != 0:
        ctx.close()
        if weights is None:
            loaded.close()
        raise ModelLoadError(f"llama.cpp could not set the LoRA adapters of {path.name} on its context")
    return Opened(loaded, ctx, threads)


def _context_params(settings: LoadSettings, threads: int):
    ctx_params = llama_cpp.llama_context_default_params()
    # room for every sequence's n_ctx tokens, each in a stream of its own (llama-server's -np N). In
    # one unified cache a sequence's cells land wherever others left room, so its rows' sums depend
    # on what other requests ran, and each row attends over every cell held: a lone stream on the
    # tiny pair, beside three idle slots' cached prompts, drafted at 84 us a token where its own
    # stream took 37 (flash attention off; masked cells are computed all the same).
    ctx_params.n_ctx = settings.n_ctx * settings.n_seq
    ctx_params.n_batch = settings.n_batch
    ctx_params.n_ubatch = settings.n_batch
    ctx_params.n_seq_max = settings.n_seq
    ctx_params.kv_unified = False
    # A sliding-window model (Gemma, gpt-oss) with a window-sized cache reuses the cells of
    # tokens that no later token can see. A cache cut back past them would attend over a window
    # with holes: `truncate` then starts over, which a draft, cut back after every step, cannot
    # afford. So only a target asks for one; everything else keeps every position.
    ctx_params.swa_full = not settings.window_cache
    ctx_params.n_threads = threads
    ctx_params.n_threads_batch = threads
    ctx_params.no_perf = True
    ctx_params.type_k = ctx_params.type_v = KV_TYPES[settings.kv_type]
    ctx_params.flash_attn_type = FLASH_ATTENTION[settings.flash_attention]
    if settings.kv_type != "f16":  # llama.cpp quantizes the V cache only with flash attention
        if settings.flash_attention == "off":
            raise InvalidSetting(f"--kv-type {settings.kv_type} needs flash attention: drop --flash-attn off")
        ctx_params.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    return ctx_params
