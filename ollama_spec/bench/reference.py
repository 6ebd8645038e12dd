"""Reference rows through llama-cpp-python's own `Llama`: its target alone, its draft_model path and
prompt lookup.

All use `Llama.generate`, which compares the target's sampled token with each drafted token and
keeps logits for every position (`logits_all=True`, which its draft_model path needs). One `Llama`
serves the three rows (its draft_model swapped between generations), loaded after the engine is
closed, so the target is never in memory twice. The rows' runs are interleaved as the engine's
are, and their own target-alone row gives the speed-ups that compare with ours across the two
phases: a shared machine's speed drifts between them by more than the differences measured.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
from llama_cpp import Llama
from llama_cpp.llama_speculative import LlamaDraftModel, LlamaPromptLookupDecoding

from ollama_spec.bench.prompts import Prompt
from ollama_spec.bench.runner import Progress, RowTimer, interleaved, sampling_for
from ollama_spec.bench.samples import LLAMA_CPP_BASELINE, LLAMA_CPP_DRAFT, PROMPT_LOOKUP, PeakMemory, Row, Sample
from ollama_spec.bench.settings import WARMUP_TOKENS, BenchSettings
from ollama_spec.decoding.proposer_table import named_source
from ollama_spec.errors import ModelLoadError
from ollama_spec.integrations.llama_cpp_python import OllamaDraftModel
from ollama_spec.llama.canary import decide_repack
from ollama_spec.llama.load_params import (
    apply_lora_adapters,
    choose_flash_attention,
    default_threads,
    extra_bufts_default,
)
from ollama_spec.llama.log import log_mark
from ollama_spec.models.compat import load_kv_overrides
from ollama_spec.models.heads import is_head
from ollama_spec.models.resolve import ResolvedModel, resolve_model


class CountingDraft(LlamaDraftModel):
    """Wraps a draft_model: counts proposals and calls, and times them."""

    def __init__(self, inner: LlamaDraftModel):
        self.inner = inner
        self.calls = 0
        self.drafted = 0
        self.seconds = 0.0

    def __call__(self, input_ids: np.ndarray, /, **kwargs) -> np.ndarray:
        start = time.perf_counter()
        out = self.inner(input_ids, **kwargs)
        self.seconds += time.perf_counter() - start
        self.calls += 1
        self.drafted += len(out)
        return out

    def reset(self) -> None:
        self.calls, self.drafted, self.seconds = 0, 0, 0.0
        if isinstance(self.inner, OllamaDraftModel):
            self.inner.reset()  # a cold draft cache, as the engine starts each generation


def run_reference_rows(
    target: ResolvedModel,
    draft_name: str,
    models_dir: str | None,
    k: int,
    prompts: Sequence[Prompt],
    prompt_tokens: dict[str, list[int]],
    settings: BenchSettings,
    progress: Progress = lambda label: None,
    beside: Sequence[tuple[Row, RowTimer]] = (),
) -> list[Row]:
    """llama-cpp-python's target alone, its draft_model path (OllamaDraftModel, K drafts) and prompt lookup
    (K tokens), and the `beside` rows (ours again, llama.cpp's own loop), all interleaved."""
    threads = settings.n_threads or default_threads()  # the engine's default too
    # llama-cpp-python's draft_model path runs a draft model only: an EAGLE-3 head and the target's MTP
    # layers get no row there
    head = named_source(draft_name) is not None or is_head(resolve_model(draft_name, models_dir).info)
    draft = (
        None
        if head
        else OllamaDraftModel(
            draft_name,
            num_pred_tokens=k,
            models_dir=models_dir,
            n_ctx=settings.context,
            n_threads=threads,
            repack=settings.repack,
        )
    )
    rows = [
        (Row("llama-cpp-python target alone", LLAMA_CPP_BASELINE), None),
        *(
            []
            if draft is None
            else [(Row(f"llama-cpp-python draft_model K={k}", LLAMA_CPP_DRAFT, k), CountingDraft(draft))]
        ),
        (Row(f"prompt lookup K={k}", PROMPT_LOOKUP, k), CountingDraft(LlamaPromptLookupDecoding(num_pred_tokens=k))),
    ]
    try:
        llm = _load(target, settings, threads)
        try:
            timers = [(row, _timer(llm, drafter, prompt_tokens, settings)) for row, drafter in rows]
            _run_rows([*timers, *beside], prompts, settings, progress)
        finally:
            llm.close()
    finally:
        if draft is not None:
            draft.close()
    return [row for row, _ in rows] + [row for row, _ in beside]


def _timer(
    llm: Llama, draft: CountingDraft | None, prompt_tokens: dict[str, list[int]], settings: BenchSettings
) -> RowTimer:
    def run(prompt: Prompt, max_tokens: int, run: int) -> Sample:
        return _generate(llm, draft, prompt_tokens[prompt.name], max_tokens, settings, prompt.name, run)

    return run


def _load(target: ResolvedModel, settings: BenchSettings, threads: int) -> Llama:
    overrides = dict(load_kv_overrides(target.info))
    mark = log_mark()
    try:
        with extra_bufts_default(decide_repack(settings.repack).enabled):
            llm = Llama(
                model_path=str(target.path),
                n_ctx=settings.context,
                n_gpu_layers=-1,
                n_threads=threads,
                n_threads_batch=threads,
                seed=settings.seed,
                logits_all=True,
                kv_overrides=overrides or None,
                verbose=False,
                flash_attn=choose_flash_attention(settings.flash_attention) != "off",
            )
    except ValueError as exc:
        raise ModelLoadError(f"llama-cpp-python could not load {target.path}: {exc}") from None
    try:  # Llama's own lora_path takes one adapter; a model may carry several, set as the engine sets them
        apply_lora_adapters(llm._model.model, llm._ctx.ctx, target.adapter_paths, mark, target.name)
    except ModelLoadError:
        llm.close()
        raise
    return llm


def _run_rows(
    rows: list[tuple[Row, RowTimer]], prompts: Sequence[Prompt], settings: BenchSettings, progress: Progress
) -> None:
    with PeakMemory() as memory:
        if settings.warmup:
            for row, timer in rows:
                timer(prompts[0], min(WARMUP_TOKENS, settings.max_tokens), -1)
                progress(f"warm-up {row.label}")
        memory.take()
        for run, prompt, (row, timer) in interleaved(rows, prompts, settings.runs):
            row.samples.append(timer(prompt, settings.max_tokens, run))
            row.peak_rss = max(row.peak_rss, memory.take())
            progress(f"{row.label} · {prompt.name}")


def _generate(
    llm: Llama,
    draft: CountingDraft | None,
    prompt: list[int],
    max_tokens: int,
    settings: BenchSettings,
    name: str,
    run: int,
) -> Sample:
    sampling = sampling_for(settings)
    llm.reset()  # no prompt reuse from the last run: the engine re-reads the prompt too
    llm.draft_model = draft  # read by Llama.generate at each step: None decodes one token at a time
    if draft is not None:
        draft.reset()
    tokens: list[int] = []
    start = time.perf_counter()
    first = 0.0
    # Llama.generate never stops at end of generation itself: like ignore_eos, it runs to max_tokens.
    stream = llm.generate(
        prompt,
        temp=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        min_p=sampling.min_p,
        repeat_penalty=1.0,
        reset=True,
    )
    try:
        for token in stream:
            if not tokens:
                first = time.perf_counter() - start
            tokens.append(int(token))
            if len(tokens) >= max_tokens:
                break
    finally:
        stream.close()
    total = time.perf_counter() - start
    if draft is None:
        return Sample(name, run, tokens, first, total, steps=len(tokens))
    # One target pass for the prompt, then one per draft call; each pass emits its accepted
    # drafts plus the target's own token.
    steps = draft.calls + 1
    # Drafting starts after the first token here, so the target's share is the rest of decoding.
    return Sample(
        name,
        run,
        tokens,
        first,
        total,
        steps=steps,
        drafted=draft.drafted,
        accepted=max(len(tokens) - steps, 0),
        draft_s=draft.seconds,
        verify_s=max(total - first - draft.seconds, 0.0),
    )
