"""Benchmark results as a terminal table and its summary lines (report_files.py writes the files)."""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field

from ollama_spec.bench.model import efficiency
from ollama_spec.bench.prompts import Prompt
from ollama_spec.bench.runner import Costs
from ollama_spec.bench.samples import (
    BASELINE,
    BESIDE_AUTO,
    BESIDE_BASELINE,
    BESIDE_SPECULATIVE,
    DRAFT_AND_LOOKUP,
    LLAMA_CPP_BASELINE,
    LLAMA_CPP_DRAFT,
    LOCAL_BASELINE,
    LOOKUP,
    NATIVE,
    PROMPT_LOOKUP,
    SPECULATIVE,
    SPECULATIVE_AUTO,
    Row,
)
from ollama_spec.bench.settings import BenchSettings
from ollama_spec.llama.load_params import default_threads
from ollama_spec.models.gguf_info import format_bytes

COLUMNS = (
    "row",
    "tok/s (min–max)",
    "speed-up",
    "accepted",
    "α",
    "tok/step",
    "draft/verify",
    "python/step",
    "TTFT",
    "peak RSS",
    "predicted",
    "efficiency",
    "greedy = target",
)


@dataclass
class BenchReport:
    target: str
    draft: str
    settings: BenchSettings
    prompts: tuple[Prompt, ...]
    rows: list[Row]
    costs: Costs
    mismatches: list[str] = field(default_factory=list)
    near_ties: list[str] = field(default_factory=list)
    # llama-cpp-python's rows that part from our target alone past what rounding explains in our batches:
    # reported, but no verdict on ollama-spec's own output
    reference_mismatches: list[str] = field(default_factory=list)
    load_average: tuple[float, float] | None = None  # 1-minute load at start and end: others' work skews timings

    @property
    def baseline(self) -> Row:
        return next(r for r in self.rows if r.kind == BASELINE)

    def speedup(self, row: Row) -> float:
        base = self.baseline.tokens_per_second
        return row.tokens_per_second / base if base else 0.0

    def efficiency(self, row: Row) -> float | None:
        return efficiency(self.speedup(row), row.predicted_speedup) if row.predicted_speedup else None

    @property
    def best(self) -> Row:
        return best_speculative(self.rows)


def best_speculative(rows: list[Row]) -> Row:
    """The speculative row with the highest median tok/s."""
    return max((r for r in rows if r.kind == SPECULATIVE), key=lambda r: r.tokens_per_second)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def table_cells(report: BenchReport) -> list[tuple[str, ...]]:
    cells = []
    for row in report.rows:
        rates = row.run_rates()
        split = "-" if row.draft_share is None else f"{row.draft_share:.0%}/{row.verify_share:.0%}"
        eff = report.efficiency(row)
        identical = (
            "-"
            if not report.settings.greedy or row.kind == BASELINE
            else ("no" if row.mismatches else "near-tie" if row.near_ties else "yes")
        )
        cells.append(
            (
                row.label,
                f"{row.tokens_per_second:.1f} ({min(rates):.1f}–{max(rates):.1f})",
                f"{report.speedup(row):.2f}x",
                _pct(row.acceptance_rate),
                "-" if row.alpha is None else f"{row.alpha:.2f}",
                "-" if row.tokens_per_step is None else f"{row.tokens_per_step:.2f}",
                split,
                "-" if row.overhead_per_step_s is None else f"{row.overhead_per_step_s * 1000:.2f} ms",
                f"{row.ttft_s * 1000:.0f} ms",
                format_bytes(row.peak_rss),
                "-" if row.predicted_speedup is None else f"{row.predicted_speedup:.2f}x",
                "-" if eff is None else f"{eff:.2f}",
                identical,
            )
        )
    return cells


def format_table(header: tuple[str, ...], cells: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(line[i])) for line in (header, *cells)) for i in range(len(header))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in (header, *cells)]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_markdown_table(header: tuple[str, ...], cells: list[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(line) + " |" for line in cells]
    return "\n".join(lines)


def summary_lines(report: BenchReport) -> list[str]:
    s, costs, best = report.settings, report.costs, report.best
    verify = ", ".join(f"K={k}: {v:.2f}" for k, v in ((k, costs.verify_ratio(k)) for k in sorted(costs.verify_s)))
    lines = [
        (
            f"target {report.target}, draft {report.draft}; {len(report.prompts)} prompts x {s.runs} runs x "
            f"{s.max_tokens} tokens, temperature {s.temperature:g}, seed {s.seed}, threads {s.n_threads or default_threads()}"
        ),
        (
            f"step costs: target {costs.target_step_s * 1000:.1f} ms, draft {costs.draft_step_s * 1000:.2f} ms "
            f"(c = {costs.draft_ratio:.3f}); verify batch of K+1 / target step: {verify}"
        ),
        f"best K = {best.k}: {best.tokens_per_second:.1f} tok/s, {report.speedup(best):.2f}x the target alone",
    ]
    overhead = best.overhead_per_step_s
    if overhead is not None:
        lines.append(
            f"time outside llama.cpp per target pass (the loop's own cost): {overhead * 1000:.2f} ms at K={best.k}"
        )
    lines += _auto_lines(report) + _hybrid_lines(report) + _reference_lines(report) + _ngram_lines(report)
    lines += _rpc_lines(report)
    if report.load_average and max(report.load_average) > 0.5:
        lines.append(
            f"load average {report.load_average[0]:.2f} at the start, {report.load_average[1]:.2f} at the end "
            f"({os.cpu_count()} cores): other work on the machine slows every row unevenly"
        )
    return lines


def _auto_lines(report: BenchReport) -> list[str]:
    """How K=auto compares with the best fixed K, over all prompts and on each one."""
    auto = next((r for r in report.rows if r.kind == SPECULATIVE_AUTO), None)
    fixed = [r for r in report.rows if r.kind == SPECULATIVE]
    if auto is None or not fixed:
        return []
    best = report.best
    chosen = ", ".join(f"K={k} ×{n}" for k, n in sorted(auto.k_chosen.items()))
    per_prompt = []
    for p in report.prompts:
        rate = prompt_stats(auto, p.name)["tokens_per_second"]
        top = max(fixed, key=lambda r: prompt_stats(r, p.name)["tokens_per_second"])
        top_rate = prompt_stats(top, p.name)["tokens_per_second"]
        per_prompt.append(f"{p.name} {rate / top_rate:.0%} of K={top.k}" if top_rate else p.name)
    return [
        (
            f"K=auto: {auto.tokens_per_second:.1f} tok/s, {auto.tokens_per_second / best.tokens_per_second:.0%} of "
            f"the best fixed K (K={best.k}); steps by K: {chosen}"
        ),
        "K=auto per prompt: " + "; ".join(per_prompt),
    ]


def _hybrid_lines(report: BenchReport) -> list[str]:
    """--ngram beside the draft model against the better of the two alone, both at K=auto."""
    rows = {
        r.kind: r for r in report.rows if r.kind in (SPECULATIVE_AUTO, LOOKUP, DRAFT_AND_LOOKUP) and r.tokens_per_second
    }
    if len(rows) < 3:
        return []
    hybrid = rows[DRAFT_AND_LOOKUP]
    alone = max(rows[SPECULATIVE_AUTO], rows[LOOKUP], key=lambda r: r.tokens_per_second)
    by_source = hybrid.accepted_by_source
    return [
        f"draft + n-gram (--ngram): {hybrid.tokens_per_second:.1f} tok/s, "
        f"{hybrid.tokens_per_second / alone.tokens_per_second:.2f}x the better of the two alone ({alone.label}); "
        "accepted tokens by source: " + ", ".join(f"{k} {v}" for k, v in sorted(by_source.items()))
    ]


def _reference_lines(report: BenchReport) -> list[str]:
    """The best K against the other implementations of the same loop at the same K, and what a user
    gets by default (K=auto) against them. Ours timed again in the references' phase, interleaved
    with them, where that ran; else ours from the first phase, with speed-ups over each phase's own
    target alone beside."""
    beside = {r.kind: r for r in report.rows if r.kind in (BESIDE_BASELINE, BESIDE_SPECULATIVE, BESIDE_AUTO)}
    auto = next((r for r in report.rows if r.kind == SPECULATIVE_AUTO and r.tokens_per_second), None)
    ours = (
        [(beside.get(BESIDE_SPECULATIVE), f"K={report.best.k}"), (beside.get(BESIDE_AUTO), "K=auto (the default)")]
        if beside
        else [(report.best, f"K={report.best.k}"), (auto, "K=auto (the default)")]
    )
    where = ", timed beside them (one phase, interleaved)" if beside else ""
    lines = []
    for mine, name in ours:
        for kind in (LLAMA_CPP_DRAFT, NATIVE):
            other = next((r for r in report.rows if r.kind == kind), None)
            if mine is not None and mine.tokens_per_second and other is not None and other.tokens_per_second:
                lines.append(
                    f"ours at {name} vs {other.label}{where}: {mine.tokens_per_second:.1f} vs "
                    f"{other.tokens_per_second:.1f} tok/s ({mine.tokens_per_second / other.tokens_per_second:.2f}x)"
                    + ("" if beside else _beside_baselines(report, mine, other))
                )
    return lines


def _beside_baselines(report: BenchReport, ours: Row, theirs: Row) -> str:
    """The comparison of speed-ups, each over the target alone measured beside it: the reference rows
    run after ours, and a shared machine's speed drifts between the two phases."""
    base = next((r for r in report.rows if r.kind == LLAMA_CPP_BASELINE), None)
    if theirs.kind not in (LLAMA_CPP_DRAFT, PROMPT_LOOKUP) or base is None or not base.tokens_per_second:
        return ""
    mine, other = report.speedup(ours), theirs.tokens_per_second / base.tokens_per_second
    return f"; over each one's own target alone, timed beside it: {mine:.2f}x vs {other:.2f}x ({mine / other:.2f}x)"


def _ngram_lines(report: BenchReport) -> list[str]:
    ours = next((r for r in report.rows if r.kind == LOOKUP), None)
    theirs = next((r for r in report.rows if r.kind == PROMPT_LOOKUP), None)
    if ours is None or theirs is None or not theirs.tokens_per_second:
        return []
    return [
        f"n-gram lookup: ours {ours.tokens_per_second:.1f} tok/s, llama-cpp-python's {theirs.label} "
        f"{theirs.tokens_per_second:.1f} tok/s ({ours.tokens_per_second / theirs.tokens_per_second:.2f}x)"
        + _beside_baselines(report, ours, theirs)
    ]


def _rpc_lines(report: BenchReport) -> list[str]:
    """With --rpc: what the network hop costs the target alone, and what the draft wins back."""
    local = next((r for r in report.rows if r.kind == LOCAL_BASELINE), None)
    if local is None or not local.tokens_per_second or not report.baseline.tokens_per_second:
        return []
    remote, best = report.baseline.tokens_per_second, report.best.tokens_per_second
    hop_ms = (1 / remote - 1 / local.tokens_per_second) * 1000
    servers = ", ".join(report.settings.placement.rpc_servers)
    return [
        (
            f"RPC ({servers}): the target alone {remote:.1f} tok/s over the servers vs {local.tokens_per_second:.1f} on "
            f"this machine only ({hop_ms:+.2f} ms per token); speculative K={report.best.k} over the servers "
            f"{best:.1f} tok/s ({best / local.tokens_per_second:.2f}x the target on this machine)"
        )
    ]


def format_report(report: BenchReport) -> str:
    lines = [format_table(COLUMNS, table_cells(report)), "", *summary_lines(report)]
    return "\n".join(lines)


def prompt_stats(row: Row, prompt: str) -> dict:
    """One prompt's tok/s, acceptance and median time to the first token in `row`."""
    chosen = [s for s in row.samples if s.prompt == prompt]
    decode = sum(s.decode_s for s in chosen)
    drafted = sum(s.drafted for s in chosen)
    return {
        "tokens_per_second": round(sum(len(s.tokens) - 1 for s in chosen) / decode, 3) if decode else 0.0,
        "acceptance_rate": round(sum(s.accepted for s in chosen) / drafted, 4) if drafted else None,
        "time_to_first_token_s": round(statistics.median(s.first_token_s for s in chosen), 4) if chosen else None,
    }
