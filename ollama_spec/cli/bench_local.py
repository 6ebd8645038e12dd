"""`bench --concurrency N --in-process`: N clients on the engine's slots in this process, without HTTP.

The batch policy timed (and profiled) without a server in the way: rows from -k (default
auto,2,4,6), each at 1, 2, 4 ... N clients, interleaved round by round, with the ceiling an ideal
schedule would reach on the same passes (bench/concurrent.py)."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import click

from ollama_spec.bench.concurrent import format_concurrent, run_concurrent
from ollama_spec.bench.runner import engine_settings
from ollama_spec.bench.settings import BenchSettings, parse_k_list
from ollama_spec.cli.common import notice
from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.engine.engine import Engine
from ollama_spec.errors import InsufficientMemory
from ollama_spec.models.resolve import ResolvedModel

DEFAULT_ROWS = "auto,2,4,6"


def client_counts(most: int) -> list[int]:
    """1, 2, 4 ... up to `most`, and `most` itself."""
    counts, n = [], 1
    while n < most:
        counts.append(n)
        n *= 2
    return [*counts, most]


def bench_in_process(
    target: ResolvedModel, draft: ResolvedModel | None, ks: str | None, prompts, settings: BenchSettings, most: int, out
) -> None:
    fixed, auto = parse_k_list(ks or DEFAULT_ROWS)
    rows = ([None] if auto else []) + list(fixed)
    try:
        engine = Engine(target, draft, replace(engine_settings(settings), parallel=most), notice=notice)
    except InsufficientMemory as exc:  # the plan's advice names serve's flag; here the slots are the clients
        raise InsufficientMemory(str(exc).replace("--parallel ", "--concurrency ")) from None
    with engine:
        if engine.slots < most:
            notice(f"{target.name} runs one request at a time: the clients take turns")
        if auto:
            engine.costs.prepare(SpeculationSettings(None))  # as serve does, before any client
        report = run_concurrent(engine, prompts, settings, client_counts(most), rows, notice)
    click.echo(format_concurrent(report))
    if out:
        path = Path(out) / "results-concurrent.json"
        cells = [
            {"clients": n, "k": k or "auto", "tok_s": cell.rates, "median": cell.median}
            for (n, k), cell in report.cells.items()
        ]
        ceilings = {n: report.ceiling(n) for n in report.clients}
        lines = {n: [asdict(line) if line else None for line in report.lines(n)] for n in report.clients}
        data = {
            "model": report.model,
            "slots": report.slots,
            "max_tokens": report.max_tokens,
            "cells": cells,
            "ceiling": {n: c[0] if c else None for n, c in ceilings.items()},
            "pass_lines": lines,
            "mismatches": report.mismatches,
        }
        path.write_text(json.dumps(data, indent=2))
        click.echo(f"wrote {path}", err=True)
    if report.mismatches:
        raise click.ClickException("greedy output differs between rows (see above)")
