"""Benchmark results as files: results.json, results.md, a PNG plot and sample.html."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import asdict
from pathlib import Path

from ollama_spec.bench.model import efficiency, predicted_speedup_from_step_length
from ollama_spec.bench.report import (
    COLUMNS,
    BenchReport,
    format_markdown_table,
    prompt_stats,
    summary_lines,
    table_cells,
)
from ollama_spec.bench.sample_html import sample_page, shown_sample
from ollama_spec.bench.samples import BASELINE, SPECULATIVE, Row


def report_json(report: BenchReport) -> dict:
    rows = []
    for row in report.rows:
        rates = row.run_rates()
        rows.append(
            {
                "label": row.label,
                "kind": row.kind,
                "k": row.k,
                "tokens_per_second": round(row.tokens_per_second, 3),
                "tokens_per_second_min": round(min(rates), 3),
                "tokens_per_second_max": round(max(rates), 3),
                "tokens_per_second_by_run": [round(r, 3) for r in rates],
                "speedup": round(report.speedup(row), 4),
                "acceptance_rate": _round(row.acceptance_rate),
                "alpha": _round(row.alpha),
                "tokens_per_step": _round(row.tokens_per_step),
                "k_chosen": {str(k): n for k, n in row.k_chosen.items()},
                "drafted": row.drafted,
                "accepted": row.accepted,
                "steps": row.steps,
                "draft_share": _round(row.draft_share),
                "verify_share": _round(row.verify_share),
                "time_to_first_token_s": round(row.ttft_s, 4),
                "peak_rss_bytes": row.peak_rss,
                "overhead_per_step_s": _round(row.overhead_per_step_s, 6),
                "predicted_speedup": _round(row.predicted_speedup),
                "efficiency": _round(report.efficiency(row)),
                **_step_length_prediction(report, row),
                "identical_to_target_alone": (not row.mismatches)
                if report.settings.greedy and row.kind != BASELINE
                else None,
                "prompts": {p.name: prompt_stats(row, p.name) for p in report.prompts},
            }
        )
    costs = report.costs
    return {
        "target": report.target,
        "draft": report.draft,
        "settings": asdict(report.settings),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "cpu_count": os.cpu_count(),
            "load_average_start_end": report.load_average,
        },
        "prompts": [asdict(p) for p in report.prompts],
        "costs": {
            "target_step_s": costs.target_step_s,
            "draft_step_s": costs.draft_step_s,
            "draft_ratio": costs.draft_ratio,
            "verify_s": {str(k): v for k, v in costs.verify_s.items()},
            "verify_ratio": {str(k): costs.verify_ratio(k) for k in costs.verify_s},
        },
        "best_k": report.best.k,
        "rows": rows,
        "mismatches": report.mismatches,
        "near_ties": report.near_ties,
        "reference_mismatches": report.reference_mismatches,
    }


def _step_length_prediction(report: BenchReport, row: Row) -> dict:
    if row.predicted_speedup is None or row.tokens_per_step is None:
        return {}
    costs = report.costs
    predicted = predicted_speedup_from_step_length(
        row.tokens_per_step, row.k, costs.draft_ratio, costs.verify_ratio(row.k)
    )
    return {
        "predicted_speedup_from_tokens_per_step": round(predicted, 4),
        "efficiency_vs_tokens_per_step": round(efficiency(report.speedup(row), predicted), 4),
    }


def _round(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def report_markdown(report: BenchReport) -> str:
    lines = [f"# ollama-spec bench: {report.target} + {report.draft}", ""]
    lines += [f"- {line}" for line in summary_lines(report)]
    lines += [
        "",
        format_markdown_table(COLUMNS, table_cells(report)),
        "",
        (
            "tok/s: generated tokens after the first / decode time, median over runs (min–max); "
            "tok/step: tokens per target pass; draft/verify: shares of generation time; "
            "python/step: time outside llama.cpp per target pass (ours only); "
            "α: accepted / tried drafts (the drafts after a rejection are never tried); "
            "predicted: Leviathan et al. with the measured α and step costs; "
            "efficiency: measured / predicted speed-up."
        ),
        "",
        "![tokens/s and acceptance vs K](bench.png)",
        "",
    ]
    if report.mismatches:
        lines += ["## Greedy outputs that differ from the target alone", ""] + [f"- {m}" for m in report.mismatches]
    if report.near_ties:
        lines += ["", "## Greedy outputs that part at a floating-point near-tie", ""] + [
            f"- {m}" for m in report.near_ties
        ]
    if report.reference_mismatches:
        lines += ["", "## llama-cpp-python's own outputs that differ from the target alone", ""] + [
            f"- {m}" for m in report.reference_mismatches
        ]
    return "\n".join(lines)


def plot(report: BenchReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display needed
    import matplotlib.pyplot as plt

    spec = sorted((r for r in report.rows if r.kind == SPECULATIVE), key=lambda r: r.k)
    ks = [r.k for r in spec]
    base = report.baseline.tokens_per_second
    fig, (speed, accept) = plt.subplots(1, 2, figsize=(11, 4.2))
    rates = [r.tokens_per_second for r in spec]
    low = [r.tokens_per_second - min(r.run_rates()) for r in spec]
    high = [max(r.run_rates()) - r.tokens_per_second for r in spec]
    speed.errorbar(ks, rates, yerr=[low, high], marker="o", capsize=3, label="speculative (median, min–max)")
    predicted = [(k, base * r.predicted_speedup) for k, r in zip(ks, spec) if r.predicted_speedup]
    if predicted:
        speed.plot(*zip(*predicted), linestyle="--", marker="x", label="predicted (Leviathan, measured costs)")
    speed.axhline(base, color="grey", linestyle=":", label=f"target alone ({base:.1f} tok/s)")
    for row, marker in zip((r for r in report.rows if r.kind != SPECULATIVE and not r.is_baseline), ("s", "^", "D")):
        speed.plot([row.k], [row.tokens_per_second], marker=marker, linestyle="none", label=row.label)
    speed.set(xlabel="K (draft tokens per step)", ylabel="tokens/s", title="Generation speed")
    speed.set_ylim(bottom=0)
    speed.legend(fontsize=8)
    accept.plot(ks, [r.acceptance_rate or 0 for r in spec], marker="o", label="acceptance rate")
    accept.plot(
        ks,
        [(r.tokens_per_step or 0) / (r.k + 1) for r in spec],
        marker="x",
        linestyle="--",
        label="tokens per step / (K+1)",
    )
    accept.set(xlabel="K (draft tokens per step)", ylabel="fraction", title="Acceptance", ylim=(0, 1.05))
    accept.legend(fontsize=8)
    for axis in (speed, accept):
        axis.set_xticks(ks)
        axis.grid(alpha=0.3)
    fig.suptitle(f"{report.target} drafted by {report.draft}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_outputs(report: BenchReport, out: Path) -> list[Path]:
    """results.json, results.md, bench.png and (where a row kept one) sample.html in `out` (created if needed)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "results.json", out / "results.md", out / "bench.png"]
    paths[0].write_text(json.dumps(report_json(report), indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(report_markdown(report), encoding="utf-8")
    plot(report, paths[2])
    if (shown := shown_sample(report.rows, report.best)) is not None:
        row, sample = shown
        prompt = next((p for p in report.prompts if p.name == sample.prompt), None)
        paths.append(out / "sample.html")
        paths[-1].write_text(sample_page(report.target, report.draft, row, sample, prompt), encoding="utf-8")
    return paths
