"""bench's in-process rows: every row timed under one progress bar, then greedy outputs checked against
the target alone; `bench` imports this module only when it times rows (not for --url)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from ollama_spec.bench import runner  # by its module: tests stand in for its functions
from ollama_spec.bench.native import native_row, run_native_row
from ollama_spec.bench.reference import run_reference_rows
from ollama_spec.bench.report import BenchReport, best_speculative
from ollama_spec.bench.samples import NATIVE, compare_tokens
from ollama_spec.bench.settings import BenchSettings


def measure(
    target_model, draft_model, draft_name, models_dir, prompts, settings: BenchSettings, native: str | None = None
) -> BenchReport:
    """Every row timed (ours, then the references or, with --rpc, the target on this machine alone, and
    --native's), under one progress bar; greedy rows then checked against the target alone."""
    load_start = _load_average()
    # With --rpc the references are replaced by the target alone on this machine: llama-cpp-python's
    # own path cannot keep its draft off the RPC servers, and the row that matters is the hop's cost.
    rpc = bool(settings.placement.rpc_servers)
    # Where a second copy of the pair fits, ours (and the native loop) run again in the references'
    # phase, interleaved with them: the comparisons then do not span the drift between phases.
    beside = not rpc and runner.can_time_beside(target_model, draft_model)
    n_beside = (2 + settings.auto + bool(native)) if beside else 0
    units = (
        runner.planned_units(settings, len(prompts), with_reference=not rpc, beside=n_beside)
        + (settings.runs * len(prompts) if native and not beside else 0)
        + (runner.local_baseline_units(settings, len(prompts)) if rpc else 0)
    )
    with click.progressbar(
        length=units,
        label="benchmarking",
        file=sys.stderr,
        show_pos=True,
        hidden=not sys.stderr.isatty(),
        item_show_func=lambda label: label,
    ) as bar:

        def advance(label: str) -> None:
            bar.update(1, label)

        engine_run = runner.run_engine_rows(target_model, draft_model, prompts, settings, advance)
        pair = (target_model, draft_model, draft_name, models_dir)
        rows = engine_run.rows + _second_phase(pair, prompts, settings, native, engine_run, rpc, beside, advance)
    report = BenchReport(
        target_model.name,
        draft_name if draft_model is None else draft_model.name,
        settings,
        tuple(prompts),
        rows,
        engine_run.costs,
        load_average=(load_start, _load_average()) if load_start is not None else None,
    )
    if settings.greedy:
        _compare_greedy(report, target_model, settings, engine_run)
    return report


def _second_phase(pair, prompts, settings: BenchSettings, native, engine_run, rpc: bool, beside: bool, advance):
    """The rows after ours: with --rpc the target on this machine alone; else llama-cpp-python's references,
    with ours (and --native's) again beside them where a second copy of the pair fits; --native's last where
    it does not."""
    target_model, draft_model, draft_name, models_dir = pair
    best = best_speculative(engine_run.rows)
    if rpc:
        return [runner.run_local_baseline(target_model, prompts, settings, advance)]
    references = (target_model, draft_name, models_dir, best.k, prompts, engine_run.prompt_tokens, settings, advance)
    if beside:
        with runner.beside_engine(target_model, draft_model, settings) as engine:
            extra = runner.beside_rows(engine, best.k, settings)
            if native:
                texts = engine_run.prompt_texts
                extra.append(native_row(Path(native), target_model, draft_model, best.k, texts, settings))
            return run_reference_rows(*references, beside=extra)
    rows = run_reference_rows(*references)
    if native:
        texts = engine_run.prompt_texts
        rows.append(run_native_row(Path(native), target_model, draft_model, best.k, prompts, texts, settings, advance))
    return rows


def _compare_greedy(report: BenchReport, target_model, settings: BenchSettings, engine_run) -> None:
    """Each greedy row's tokens against the target alone's (which must agree across its own runs too),
    the differences sorted into rounding (near ties) and errors, ours apart from the references'."""
    baseline, rows = report.baseline, report.rows
    expected = {}
    for sample in baseline.samples:
        if expected.setdefault(sample.prompt, sample.tokens) != sample.tokens:
            baseline.mismatches.append(f"target alone: prompt '{sample.prompt}' is not deterministic across runs")
    batch_choice = runner.BatchChoice(target_model, settings, engine_run.prompt_tokens, expected)
    try:
        for row in rows:
            if row is not baseline and row.kind != NATIVE:  # the native row gives counts, not tokens
                compare_tokens(row, expected, engine_run.margins, batch_choice)
    finally:
        batch_choice.close()
    report.mismatches = [m for row in rows if not row.is_reference for m in row.mismatches]
    report.reference_mismatches = [m for row in rows if row.is_reference for m in row.mismatches]
    report.near_ties = [m for row in rows for m in row.near_ties]


def _load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None  # not on Windows
