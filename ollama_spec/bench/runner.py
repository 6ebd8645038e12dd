"""Target alone and speculative rows, measured through the engine in this process.

One Engine holds target and draft; the target-alone row uses the same loaded target with the
draft switched off (`use_draft=False`), so every row runs on the same weights, cache and threads, and the runs of
all rows are interleaved (drift on a shared machine hits each row alike).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import psutil

from ollama_spec.bench.model import predicted_speedup
from ollama_spec.bench.prompts import Prompt
from ollama_spec.bench.samples import (
    BASELINE,
    BESIDE_AUTO,
    BESIDE_BASELINE,
    BESIDE_SPECULATIVE,
    DRAFT_AND_LOOKUP,
    LOCAL_BASELINE,
    LOOKUP,
    SPECULATIVE,
    SPECULATIVE_AUTO,
    PeakMemory,
    Row,
    Sample,
)
from ollama_spec.bench.settings import CALIBRATION_REPEATS, WARMUP_TOKENS, BenchSettings
from ollama_spec.decoding.loop import DEFAULT_MAX_SPECULATIVE_TOKENS, SpeculationSettings
from ollama_spec.decoding.proposer_table import DRAFT, HYBRID, NGRAM
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.calibration import measure_step_costs
from ollama_spec.engine.engine import Engine, EngineSettings, Request, Result
from ollama_spec.llama.head_sequences import HeadCalibration
from ollama_spec.llama.load_params import gpu_offload_supported
from ollama_spec.llama.model import LoadedModel
from ollama_spec.models.resolve import ResolvedModel
from ollama_spec.planning.placement import Placement
from ollama_spec.prompting.text_stream import Run, merge_runs

Progress = Callable[[str], None]
# Times one row on one prompt: (prompt, max_tokens, run) -> the sample. What the reference phase
# interleaves with its own rows.
RowTimer = Callable[[Prompt, int, int], Sample]


@dataclass
class Costs:
    """Measured step costs, in seconds, at the middle of a generation's context."""

    target_step_s: float
    draft_step_s: float
    verify_s: dict[int, float] = field(default_factory=dict)  # K -> one target batch of K+1 tokens

    @property
    def draft_ratio(self) -> float:
        return self.draft_step_s / self.target_step_s

    def verify_ratio(self, k: int) -> float:
        return self.verify_s[k] / self.target_step_s


@dataclass
class EngineRun:
    rows: list[Row]
    costs: Costs
    prompt_tokens: dict[str, list[int]]  # the exact tokens every row was given, by prompt name
    margins: dict[str, list[float]] = field(default_factory=dict)  # greedy: target's top-1 - top-2 logits
    prompt_texts: dict[str, str] = field(default_factory=dict)  # the same prompts as text, special tokens written out


def planned_units(settings: BenchSettings, n_prompts: int, with_reference: bool = True, beside: int = 0) -> int:
    """How many progress units `run_engine_rows` and `run_reference_rows` report, for the bar
    (`beside`: rows timed with the references, besides their own)."""
    configs = 1 + len(settings.ks) + settings.auto + settings.ngram
    units = (configs if settings.warmup else 0) + 1 + settings.runs * n_prompts * configs
    if with_reference:  # llama-cpp-python's target alone, draft_model and prompt lookup
        units += (3 + beside) * ((1 if settings.warmup else 0) + settings.runs * n_prompts)
    return units


def sampling_for(settings: BenchSettings) -> SamplingSettings:
    return SamplingSettings(temperature=settings.temperature, seed=settings.seed)


def run_engine_rows(
    target: ResolvedModel,
    draft: ResolvedModel,
    prompts: Sequence[Prompt],
    settings: BenchSettings,
    progress: Progress = lambda label: None,
) -> EngineRun:
    """Warm up, calibrate step costs, then time target alone and each K over runs x prompts."""
    with Engine(target, draft, engine_settings(settings)) as engine, PeakMemory() as memory:
        rows = [Row("target alone", BASELINE)] + [Row(f"speculative K={k}", SPECULATIVE, k) for k in settings.ks]
        if settings.auto:
            rows.append(Row("speculative K=auto", SPECULATIVE_AUTO))
        if settings.ngram:
            rows.append(Row("n-gram lookup K=auto", LOOKUP))
            rows.append(Row("draft + n-gram K=auto (--ngram)", DRAFT_AND_LOOKUP))
        requests = {p.name: _request(p, settings, settings.max_tokens) for p in prompts}
        prompt_tokens = {name: engine.prompt_tokens(r) for name, r in requests.items()}
        prompt_texts = {name: native_prompt_text(engine.target, tokens) for name, tokens in prompt_tokens.items()}

        _warm_up(engine, rows, prompts, settings, progress)
        costs = measure_costs(engine, prompt_tokens[prompts[0].name], settings)
        progress("calibrating step costs")
        _time_rows(engine, rows, prompts, settings, memory, progress)
        margins = {}
        if settings.greedy:  # where the target alone nearly hesitated, rounding may tip the choice
            for sample in rows[0].samples:
                if sample.run == 0:
                    margins[sample.prompt] = engine.greedy_margins(prompt_tokens[sample.prompt], sample.tokens)
    for row in rows:
        if row.kind == SPECULATIVE and row.alpha is not None:
            row.predicted_speedup = predicted_speedup(row.alpha, row.k, costs.draft_ratio, costs.verify_ratio(row.k))
    return EngineRun(rows, costs, prompt_tokens, margins, prompt_texts)


def native_prompt_text(model: LoadedModel, tokens: Sequence[int]) -> str:
    """The prompt as text for llama.cpp's own binaries, which take text and read it back (BOS added,
    special tokens parsed). A SentencePiece tokenizer puts its "▁" back before the text after a
    control token ("[INST] Hi" reads "[INST]", "▁", "▁Hi"): where the plain text does not read
    back as `tokens`, the space that each such piece starts with is left out."""
    body = [t for t in tokens if t != model.bos_token]
    plain = model.detokenize(body, special=True)
    if model.tokenize(plain, add_bos=True, special=True) == list(tokens):
        return plain
    pieces, after_control = [], True  # the tokenizer adds one before the text, too
    for token in body:
        piece, special = model.token_piece(token)
        pieces.append(piece[1:] if after_control and not special and piece.startswith(b" ") else piece)
        after_control = special
    text = b"".join(pieces).decode("utf-8", errors="replace")
    return text if model.tokenize(text, add_bos=True, special=True) == list(tokens) else plain


def run_local_baseline(
    target: ResolvedModel, prompts: Sequence[Prompt], settings: BenchSettings, progress: Progress = lambda label: None
) -> Row:
    """The target alone on this machine only: beside rows whose target is spread over RPC servers,
    what the network hop costs (its own engine, so after the others, not interleaved with them)."""
    row = Row("target alone, no RPC", LOCAL_BASELINE)
    with Engine(target, None, engine_settings(settings, Placement())) as engine, PeakMemory() as memory:
        _warm_up(engine, [row], prompts, settings, progress)
        _time_rows(engine, [row], prompts, settings, memory, progress)
    return row


def can_time_beside(target: ResolvedModel, draft: ResolvedModel | None) -> bool:
    """Can ours be loaded again while the references run? Not on a GPU (a second copy of the target
    there is the user's VRAM); on a CPU when this machine's free memory holds both copies whole."""
    if gpu_offload_supported():
        return False
    try:
        size = target.path.stat().st_size + (draft.path.stat().st_size if draft is not None else 0)
    except OSError:
        return False
    return psutil.virtual_memory().available > 2 * size + (1 << 30)


def beside_engine(target: ResolvedModel, draft: ResolvedModel, settings: BenchSettings) -> Engine:
    """Ours loaded again, as the rows' engine was (close it, or use it in a `with`)."""
    return Engine(target, draft, engine_settings(settings))


def beside_rows(engine: Engine, best_k: int, settings: BenchSettings) -> list[tuple[Row, RowTimer]]:
    """Our target alone, best K and K=auto on `engine`, to be timed interleaved with the reference rows.

    The two phases run minutes apart, and a shared machine's speed drifts by 5-12 % between them
    (seen on a 2-core VM, either way), more than the differences compared; so where two copies of
    the target fit, ours runs again in their phase, in the same interleaved order."""
    rows = [
        Row("ours: target alone (beside the references)", BESIDE_BASELINE),
        Row(f"ours: K={best_k} (beside the references)", BESIDE_SPECULATIVE, best_k),
    ]
    if settings.auto:
        rows.append(Row("ours: K=auto (beside the references)", BESIDE_AUTO))

    def timer(row: Row) -> RowTimer:
        return lambda prompt, max_tokens, run: _timed(engine, row, prompt, settings, max_tokens, run)

    return [(row, timer(row)) for row in rows]


def interleaved(rows: Sequence, prompts: Sequence[Prompt], runs: int):
    """(run, prompt, row) in timing order: every row runs each prompt back to back, in alternating
    order, so that a busy moment on a shared machine hits the rows alike instead of one row's whole run."""
    for run in range(runs):
        for i, prompt in enumerate(prompts):
            for row in rows if (run * len(prompts) + i) % 2 == 0 else rows[::-1]:
                yield run, prompt, row


def _warm_up(
    engine: Engine, rows: list[Row], prompts: Sequence[Prompt], settings: BenchSettings, progress: Progress
) -> None:
    if settings.warmup:
        for row in rows:
            _generate(engine, _request(prompts[0], settings, min(WARMUP_TOKENS, settings.max_tokens), row), row)
            progress(f"warm-up {row.label}")


def _time_rows(
    engine: Engine,
    rows: list[Row],
    prompts: Sequence[Prompt],
    settings: BenchSettings,
    memory: PeakMemory,
    progress: Progress,
) -> None:
    memory.take()
    for run, prompt, row in interleaved(rows, prompts, settings.runs):
        row.samples.append(_timed(engine, row, prompt, settings, settings.max_tokens, run))
        row.peak_rss = max(row.peak_rss, memory.take())
        progress(f"{row.label} · {prompt.name}")


def local_baseline_units(settings: BenchSettings, n_prompts: int) -> int:
    return (1 if settings.warmup else 0) + settings.runs * n_prompts


def engine_settings(settings: BenchSettings, placement: Placement | None = None) -> EngineSettings:
    """How every row's pair loads (one slot; the served bench asks for more)."""
    return EngineSettings(
        n_ctx=settings.context,
        n_threads=settings.n_threads,
        flash_attention=settings.flash_attention,
        memory_check=settings.memory_check,
        repack=settings.repack,
        placement=settings.placement if placement is None else placement,
        mtp=settings.mtp,
    )


class BatchChoice:
    """Why the target itself may pick a speculative run's token where the target alone picked another,
    for bench's greedy comparison: in some verify batch (Engine.chosen_in_a_batch), or on a cache
    built in the run's own batches (Engine.chosen_as_batched). The target alone, loaded again only
    if a difference needs it (the rows' engines are gone by then), each difference tested once."""

    def __init__(
        self,
        target: ResolvedModel,
        settings: BenchSettings,
        prompt_tokens: dict[str, list[int]],
        expected: dict[str, list[int]],
    ):
        self.target, self.settings, self.prompt_tokens, self.expected = target, settings, prompt_tokens, expected
        self._engine: Engine | None = None
        self._seen: dict[tuple[str, int, int], int | None] = {}

    def __call__(self, prompt: str, at: int, token: int, batches: Sequence[tuple[int, int]] = ()) -> str | None:
        """Where the target picks `token` for position `at` of `prompt`'s text: words for the report, or None."""
        if self._engine is None:
            self._engine = Engine(self.target, None, replace(engine_settings(self.settings), mtp=False))
        key = (prompt, at, token)
        if key not in self._seen:
            largest = max((*self.settings.ks, DEFAULT_MAX_SPECULATIVE_TOKENS if self.settings.auto else 0)) + 1
            self._seen[key] = self._engine.chosen_in_a_batch(
                self.prompt_tokens[prompt], self.expected[prompt], at, token, max_batch=largest
            )
        if (size := self._seen[key]) is not None:
            return f"the target itself picks the same token in a batch of {size}"
        if batches and self._engine.chosen_as_batched(
            self.prompt_tokens[prompt], self.expected[prompt], batches, at, token
        ):
            return "the target itself picks the same token on a cache built in the run's own batches"
        return None

    def close(self) -> None:
        if self._engine is not None:
            self._engine.close()


def measure_costs(engine: Engine, prompt: list[int], settings: BenchSettings) -> Costs:
    """Median time of one target step, one draft step and one verify batch of K+1 for each K.

    Timed at the context position halfway through a generation, where the average step is.
    """
    k_max = max(settings.ks, default=DEFAULT_MAX_SPECULATIVE_TOKENS)
    room = engine.target.n_ctx - k_max - 2
    position = min(len(prompt) + settings.max_tokens // 2, room)
    context = (prompt * (position // max(len(prompt), 1) + 1))[:position]
    drafter = HeadCalibration(engine.head) if engine.head is not None else engine.draft  # as -k auto times it
    measured = measure_step_costs(engine.target, drafter, k_max, context, repeats=CALIBRATION_REPEATS, every_size=True)
    return Costs(
        target_step_s=measured.verify_s[0],
        draft_step_s=measured.draft_step_s,
        verify_s={k: measured.verify_s[k] for k in range(1, k_max + 1)},
    )


# The draft source of the rows that draft with other than the draft model alone.
_ROW_SOURCES = {LOOKUP: NGRAM, DRAFT_AND_LOOKUP: HYBRID}


def _request(prompt: Prompt, settings: BenchSettings, max_tokens: int, row: Row | None = None) -> Request:
    proposer = _ROW_SOURCES.get(row.kind, DRAFT) if row else DRAFT
    speculation = SpeculationSettings(row.k if row else None, proposer=proposer)
    return Request(
        prompt.prompt,
        system=prompt.system,
        max_tokens=max_tokens,
        ignore_eos=True,
        sampling=sampling_for(settings),
        speculation=speculation,
        trace_batches=settings.greedy,  # to replay a greedy difference as the run batched it
    )


def _generate(engine: Engine, request: Request, row: Row, runs: list[Run] | None = None) -> tuple[Result, float]:
    """Run one generation; return its result and the seconds both models spent inside llama.cpp.
    With a `runs` list, the text's runs (who wrote what) are gathered into it."""
    engine.clear_cache()  # every row reads its prompt: rows share one engine and the same prompts
    models = [m for m in (engine.target, engine.draft) if m is not None]
    busy = sum(m.busy_seconds for m in models)
    generation = engine.generate(request, use_draft=row.kind not in (BASELINE, LOCAL_BASELINE, BESIDE_BASELINE))
    if runs is not None:
        runs.extend(generation.pieces())
    else:
        for _ in generation:
            pass
    return generation.result, sum(m.busy_seconds for m in models) - busy


# Rows that keep one sample's text by who wrote it, for sample.html: a list built per token, microseconds
# beside a model's milliseconds, once per row.
_SHOWN_KINDS = (SPECULATIVE, SPECULATIVE_AUTO, LOOKUP, DRAFT_AND_LOOKUP)


def _timed(engine: Engine, row: Row, prompt: Prompt, settings: BenchSettings, max_tokens: int, run: int) -> Sample:
    runs = [] if row.kind in _SHOWN_KINDS and not any(s.runs for s in row.samples) else None
    sample = _sample(*_generate(engine, _request(prompt, settings, max_tokens, row), row, runs), prompt.name, run)
    sample.runs = tuple(merge_runs(runs or ()))
    return sample


def _sample(result: Result, llama_s: float, prompt: str, run: int) -> Sample:
    spec = result.speculation
    return Sample(
        prompt,
        run,
        list(result.tokens),
        result.first_token_seconds,
        result.total_seconds,
        steps=spec.steps,
        drafted=spec.drafted,
        accepted=spec.accepted,
        rejections=spec.rejections,
        k_chosen=dict(spec.k_chosen),
        accepted_by_source=dict(spec.accepted_by_source),
        draft_s=spec.draft_seconds,
        verify_s=spec.verify_seconds,
        llama_s=llama_s,
        batches=list(spec.batches or ()),
    )
