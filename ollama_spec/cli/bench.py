"""`ollama-spec bench`: target alone vs speculative decoding at each K, or any server with --url."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import click

from ollama_spec.bench.prompts import prompts_for
from ollama_spec.bench.settings import (
    DEFAULT_BENCH_TOKENS,
    DEFAULT_KS,
    DEFAULT_RUNS,
    DEFAULT_SEED,
    BenchSettings,
    parse_k_list,
)
from ollama_spec.cli.bench_http import bench_remote, bench_served, refuse_local_options, refuse_row_options
from ollama_spec.cli.common import open_store
from ollama_spec.cli.flags import PlacementFlags, into
from ollama_spec.cli.options import (
    ctx_option_with,
    draft_option,
    flash_attn_option,
    models_dir_option,
    no_check_option,
    placement_options,
    preset_option,
    repack_option,
    threads_option,
    verbose_option,
)
from ollama_spec.cli.settings import Options, bench_settings
from ollama_spec.cli.targets import apply_preset, resolve_draft
from ollama_spec.decoding.proposer_table import MTP, is_auto, named_source, needs_nextn
from ollama_spec.engine.near_ties import NEAR_TIE_LOGITS
from ollama_spec.errors import InvalidSetting
from ollama_spec.llama.log import set_verbose
from ollama_spec.models.resolve import ResolvedModel, looks_like_path, resolve_model

NGRAM_ONLY = "bench needs a draft model; the n-gram lookup row is always measured beside it (--ngram)"


@dataclass(frozen=True)
class BenchFlags(PlacementFlags):
    target: str
    preset: Any  # models.modelfile.Modelfile, or None
    draft: str | None
    ks: str
    max_tokens: int
    runs: int
    temperature: float
    seed: int
    prompts_file: str | None
    out: str | None
    url: str | None
    concurrency: int
    in_process: bool
    threads: int | None
    ctx: int | None
    native: str | None
    ngram: bool
    warmup: bool
    no_check: bool
    repack: bool | None
    flash_attn: str
    verbose: bool
    models_dir: str | None


@click.command()
@click.argument("target")
@preset_option
@draft_option("Required unless --url, TARGET's manifest has a draft layer or TARGET has MTP layers.", ngram=False)
@click.option(
    "-k",
    "ks",
    default="auto," + ",".join(map(str, DEFAULT_KS)),
    show_default=True,
    help="Comma-separated draft lengths to measure; auto adds a row where K is chosen each step.",
)
@click.option(
    "--max-tokens",
    "-n",
    type=int,
    default=DEFAULT_BENCH_TOKENS,
    show_default=True,
    help="Tokens generated per prompt (end of turn is ignored, so every run is this long).",
)
@click.option("--runs", type=int, default=DEFAULT_RUNS, show_default=True, help="Timed runs over all prompts.")
@click.option(
    "--temperature",
    "-t",
    type=float,
    default=0.0,
    show_default=True,
    help="0 = greedy, and every output is checked against the target alone.",
)
@click.option("--seed", type=int, default=DEFAULT_SEED, show_default=True, help="Sampling seed.")
@click.option(
    "--prompts",
    "prompts_file",
    help='Prompts file (JSON lines {"prompt", "system", "name"} or plain lines), or a built-in set: '
    "default (code, factual, explanation, translation, creative) or rewrite (answers that copy their "
    "input: edit a text, edit code, quote; where --ngram pays).",
)
@click.option("--out", type=click.Path(file_okay=False), help="Write results.json, results.md and bench.png here.")
@click.option(
    "--url",
    help="Benchmark an OpenAI-compatible server instead, e.g. http://localhost:8080/v1 "
    "(TARGET is the model name sent).",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Clients streaming chat completions at once, each the whole prompt set --runs times; prints the tok/s "
    "of all together, per request, p50/p95 latency and time to first token. With --url, from that server; "
    "without it, above 1, from TARGET and --draft served in this process as `serve --parallel N` serves them "
    "(127.0.0.1, a free port, stopped afterwards; one K: -k's one value, else auto). 1 without --url: the "
    "in-process rows, which time the decoding itself, without HTTP and scheduling to blur it.",
)
@click.option(
    "--in-process",
    is_flag=True,
    help="--concurrency N clients in this process on N slots, without HTTP, at 1, 2, 4 ... N "
    "clients, each -k row (default auto,2,4,6) interleaved round by round, beside the ceiling an ideal "
    "schedule reaches on the same llama.cpp passes.",
)
@threads_option
@ctx_option_with("Context length (default: max(4096, max-tokens + 1024)).")
@click.option(
    "--native",
    "native",
    type=click.Path(dir_okay=False),
    default=None,
    help="Also time llama.cpp's own llama-speculative-simple at the best K (build it with "
    "scripts/build-native-speculative.sh; greedy only).",
)
@click.option(
    "--ngram/--no-ngram",
    default=True,
    show_default=True,
    help="Also time draftless n-gram lookup (K=auto) through the same loop.",
)
@click.option(
    "--warmup/--no-warmup",
    default=True,
    show_default=True,
    help="One short unrecorded generation per row before timing.",
)
@no_check_option
@repack_option
@flash_attn_option
@placement_options
@verbose_option
@models_dir_option
@click.pass_context
@into(BenchFlags)
def bench(context: click.Context, flags: BenchFlags) -> None:
    """Measure how much faster speculative decoding makes TARGET, and at which K.

    In one process: TARGET alone (the baseline), speculative decoding at each K, and as
    references llama-cpp-python's own draft_model path at the best K and draftless prompt
    lookup. Per row: median tok/s (min–max over runs), speed-up, acceptance, tokens per target
    pass, draft/verify time split, time to first token, peak memory, and for speculative rows
    the speed-up predicted from the measured acceptance and step costs. Greedy runs must give
    the target's exact tokens; any difference is reported and the exit status is 1.

    With --url, times streaming chat completions from any OpenAI-compatible server instead; with
    --concurrency N (above 1) and no --url, from the pair served in this process, N clients at once.

    \b
    Examples:
      ollama-spec bench llama3.1:8b --draft llama3.2:1b
      ollama-spec bench llama3.1:70b -d llama3.2:1b -k 2,4,6 --max-tokens 128 --out bench-results
      ollama-spec bench llama3.1:8b --url http://localhost:8080/v1 --runs 5
      ollama-spec bench llama3.1:8b -d llama3.2:1b --concurrency 4   # served here, 4 clients at once
      ollama-spec bench llama3.1:8b -d llama3.2:1b --concurrency 8 --in-process   # 1-8 clients, no HTTP
      ollama-spec bench -f llama3.1-70b --max-tokens 128   # the preset's target and draft
      ollama-spec bench llama3.1:70b -d llama3.2:1b --rpc 192.168.1.20:50052   # + the target without RPC
      ollama-spec bench glm-4.5-air -d mtp   # the target's own MTP (NextN) layers
    """
    set_verbose(flags.verbose)
    # the loading options go to the settings with where each came from (the command line, the default)
    options = Options.of(context)
    prompts = prompts_for(flags.prompts_file)
    out, concurrency, in_process = flags.out, flags.concurrency, flags.in_process
    if out:
        _make_out_dir(Path(out))  # before minutes of timing, not after
    if flags.url:
        _bench_url(context, options, flags, prompts)
        return
    served = concurrency > 1
    if served or in_process:
        refuse_row_options(context.command, options)
    elif out:
        import matplotlib  # noqa: F401  (bench.png: without the bench extra that is said now, not after the timing)
    k_list = parse_k_list(flags.ks)
    target_model = _target(flags.target, flags.preset, flags.draft, flags.models_dir)
    # served: one K, passed apart; the settings' Ks are the rows', which a server does not time
    settings = bench_settings(options, (DEFAULT_KS, True) if served or in_process else k_list)
    draft_model, settings, draft_name = _drafter(flags, target_model, settings)
    if flags.native:  # before minutes of timing, not after
        _check_native(Path(flags.native), settings, target_model, draft_model)
    ks_given = flags.ks if options.given("ks") else None
    if in_process:
        from ollama_spec.cli.bench_local import bench_in_process

        bench_in_process(target_model, draft_model, ks_given, prompts, settings, concurrency, out)
    elif served:
        bench_served(target_model, draft_model, ks_given, prompts, settings, out, options)
    else:
        from ollama_spec.cli.bench_rows import measure  # the rows' modules: loaded when rows are timed

        report = measure(target_model, draft_model, draft_name, flags.models_dir, prompts, settings, flags.native)
        _print_report(report, out)


def _drafter(flags: BenchFlags, target: ResolvedModel, settings: BenchSettings):
    """(the draft model, the settings, the draft's name in the report): a draft model, or the target's own
    MTP layers (then every engine bench loads, the rows', the served pair's and the in-process clients', loads
    them: BenchSettings.mtp); nothing else drafts in bench's rows."""
    choice = resolve_draft(flags.draft, flags.models_dir, target)
    if choice.model is None and not choice.mtp:
        raise InvalidSetting(NGRAM_ONLY)
    if choice.mtp:
        return None, replace(settings, mtp=True), MTP
    name = choice.model.name if not flags.draft or is_auto(flags.draft) else flags.draft
    return choice.model, settings, name


def _bench_url(context: click.Context, options: Options, flags: BenchFlags, prompts) -> None:
    """--url: streaming chat completions from another server, timed."""
    if flags.in_process:
        raise InvalidSetting("--in-process times clients in this process: drop --url (or --in-process)")
    refuse_local_options(context.command, options)
    bench_remote(
        flags.target,
        flags.url,
        prompts,
        flags.max_tokens,
        flags.runs,
        flags.temperature,
        flags.seed,
        flags.warmup,
        flags.out,
        flags.concurrency,
    )


def _target(target: str, preset, draft: str | None, models_dir: str | None) -> ResolvedModel:
    """TARGET with its preset laid over it, where bench has a draft for it (--draft, or its manifest's)."""
    if not draft and looks_like_path(target):
        raise InvalidSetting("bench needs --draft DRAFT (or --url to time a server)")
    if named_source(draft) is not None and not needs_nextn(named_source(draft)):
        raise InvalidSetting(NGRAM_ONLY)
    paths = looks_like_path(target) and draft is not None and looks_like_path(draft)
    store = None if paths else open_store(models_dir)
    target_model = apply_preset(resolve_model(target, store=store), preset)
    # a manifest's own draft layer will do, and so will the target's own MTP layers
    if not draft and target_model.stored_draft is None and not target_model.info.nextn_layers:
        raise InvalidSetting("bench needs --draft DRAFT (or --url to time a server)")
    return target_model


def _check_native(native: Path, settings: BenchSettings, target_model, draft_model) -> None:
    """--native: llama.cpp's own binary, usable here for this pair (it runs on this machine alone)."""
    from ollama_spec.bench.native import check_native

    if settings.placement.rpc_servers:
        raise InvalidSetting("--native times llama.cpp's own binary on this machine: run it without --rpc")
    check_native(native, settings, target_model, draft_model)


def _print_report(report, out: str | None) -> None:
    """The report and its files; then the greedy outputs that part from the target alone, and why: rounding
    (a note) or a verification error (a warning, and the exit status 1)."""
    from ollama_spec.bench.report import format_report
    from ollama_spec.bench.report_files import write_outputs

    click.echo(format_report(report))
    if out:
        paths = write_outputs(report, Path(out))
        click.echo(f"wrote {', '.join(str(p) for p in paths)}", err=True)
    if report.near_ties:
        click.secho(
            f"\nnote: {len(report.near_ties)} greedy outputs part from the target alone where rounding decides "
            f"(the target's two best logits within {NEAR_TIE_LOGITS}, or the target itself picks the other "
            "token when the position is in a batch: llama.cpp rounds a batch of K+1 and a single token "
            "differently):",
            fg="yellow",
            err=True,
        )
        for line in report.near_ties:
            click.secho(f"  {line}", fg="yellow", err=True)
    if report.reference_mismatches:
        click.secho(
            f"\nnote: {len(report.reference_mismatches)} greedy outputs of llama-cpp-python's own rows differ from "
            "the target alone past a near-tie (its Llama evaluates in batches of its own; not a verdict on ours):",
            fg="yellow",
            err=True,
        )
        for line in report.reference_mismatches:
            click.secho(f"  {line}", fg="yellow", err=True)
    if report.mismatches:
        click.secho(
            f"\nWARNING: {len(report.mismatches)} greedy outputs differ from the target alone:",
            fg="red",
            bold=True,
            err=True,
        )
        for line in report.mismatches:
            click.secho(f"  {line}", fg="red", err=True)
        raise click.ClickException("speculative output differs from the target alone (see above)")


def _make_out_dir(out: Path) -> None:
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InvalidSetting(f"--out {out}: cannot create the folder ({exc.strerror or exc})") from None
