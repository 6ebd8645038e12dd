"""`bench --url` results: a terminal table, results.json and results.md."""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict
from pathlib import Path

from ollama_spec.bench.remote import RemoteResult
from ollama_spec.bench.report import format_markdown_table, format_table

REMOTE_COLUMNS = ("prompt", "tok/s (min–max)", "TTFT (min–max)", "tokens")


def remote_cells(result: RemoteResult) -> list[tuple[str, ...]]:
    cells = []
    for name, samples in result.by_prompt().items():
        rates = [s.tokens_per_second for s in samples]
        ttfts = [s.first_token_s * 1000 for s in samples]
        cells.append(
            (
                name,
                f"{statistics.median(rates):.1f} ({min(rates):.1f}–{max(rates):.1f})",
                f"{statistics.median(ttfts):.0f} ms ({min(ttfts):.0f}–{max(ttfts):.0f})",
                f"{statistics.median(s.tokens for s in samples):.0f}",
            )
        )
    return cells


def format_remote(result: RemoteResult) -> str:
    s = result.settings
    lines = [
        format_table(REMOTE_COLUMNS, remote_cells(result)),
        "",
        (
            f"{s.model} at {s.url}: median {result.tokens_per_second:.1f} tok/s a request, time to first token "
            f"{result.ttft_s * 1000:.0f} ms ({s.runs} run{'s' if s.runs != 1 else ''}, {s.max_tokens} max tokens)"
        ),
    ]
    if result.drafts is not None:
        lines.append(drafts_line(result))
    if s.concurrency > 1:
        lines.append(concurrency_line(result))
    return "\n".join(lines)


def drafts_line(result: RemoteResult) -> str:
    """The drafts the server said it made and how many it accepted (its `timings`)."""
    drafted, accepted = result.drafts
    share = f" ({accepted / drafted:.1%})" if drafted else ""
    return f"drafts accepted, as the server's timings say: {accepted} of {drafted}{share}"


def concurrency_line(result: RemoteResult) -> str:
    """What N clients at once got: all their tokens over the wall time, and each request's latency."""
    p50, p95 = result.latency_percentiles()
    return (
        f"{result.settings.concurrency} clients at once: {result.aggregate_tokens_per_second:.1f} tok/s in all, "
        f"{result.tokens_per_second:.1f} tok/s a request, latency p50 {p50:.2f} s, p95 {p95:.2f} s, "
        f"time to first token {result.ttft_s * 1000:.0f} ms"
    )


def write_remote_outputs(result: RemoteResult, out: Path) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    data = {
        "url": result.settings.url,
        "model": result.settings.model,
        "settings": asdict(result.settings),
        "tokens_per_second": round(result.tokens_per_second, 3),
        "time_to_first_token_s": round(result.ttft_s, 4),
        "concurrency": result.settings.concurrency,
        "aggregate_tokens_per_second": round(result.aggregate_tokens_per_second, 3),
        "latency_p50_s": round(result.latency_percentiles()[0], 4),
        "latency_p95_s": round(result.latency_percentiles()[1], 4),
        "drafted": result.drafts[0] if result.drafts else None,
        "accepted": result.drafts[1] if result.drafts else None,
        "samples": [asdict(s) | {"tokens_per_second": round(s.tokens_per_second, 3)} for s in result.samples],
    }
    paths = [out / "results.json", out / "results.md"]
    paths[0].write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    paths[1].write_text(
        f"# ollama-spec bench --url {result.settings.url}\n\n"
        + format_markdown_table(REMOTE_COLUMNS, remote_cells(result))
        + (f"\n\n{concurrency_line(result)}\n" if result.settings.concurrency > 1 else "\n"),
        encoding="utf-8",
    )
    return paths
