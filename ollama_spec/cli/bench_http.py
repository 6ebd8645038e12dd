"""bench's modes timed over HTTP: any server (--url), or the pair served in this process (--concurrency N)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

import click

from ollama_spec.bench.prompts import Prompt
from ollama_spec.bench.settings import BenchSettings
from ollama_spec.cli.common import notice
from ollama_spec.cli.options import RPC_ENVVAR
from ollama_spec.cli.settings import Options
from ollama_spec.decoding.proposer_table import MTP
from ollama_spec.errors import InvalidSetting
from ollama_spec.models.resolve import ResolvedModel

# What only a pair timed here uses: with --url the server's own options choose its draft and devices.
_LOCAL_ONLY = ("draft", "ks", "native", "rpc", "tensor_split", "split_mode", "main_gpu", "threads", "ctx", "preset")
# What only the in-process rows use: the served pair drafts at one K and times no reference rows.
_ROWS_ONLY = ("native", "ngram")


def refuse_local_options(command: click.Command, options: Options) -> None:
    """--url: the flags that choose how a pair loads here are refused, not ignored."""
    _refuse(
        command, options, _LOCAL_ONLY, "--url times a server as it runs (its own options choose its draft and devices)"
    )
    if os.environ.get(RPC_ENVVAR, "").strip():  # set for the shell, not for this command: said, not refused
        click.echo(f"note: ${RPC_ENVVAR} is not used with --url: the server places its own model", err=True)


def refuse_row_options(command: click.Command, options: Options) -> None:
    """--concurrency N without --url: the flags of rows a server does not time are refused, not ignored."""
    _refuse(command, options, _ROWS_ONLY, "--concurrency times the pair as a server runs it, at one K")


def _refuse(command: click.Command, options: Options, names: tuple[str, ...], why: str) -> None:
    flags = [max(p.opts, key=len) for p in command.params if p.name in names and options.given(p.name)]
    if flags:
        raise InvalidSetting(
            f"{why}, so {', '.join(flags)} would be ignored: drop {'them' if len(flags) > 1 else 'it'}"
        )


def bench_served(
    target_model: ResolvedModel,
    draft_model: ResolvedModel | None,
    ks: str | None,
    prompts: Sequence[Prompt],
    settings: BenchSettings,
    out: str | None,
    options: Options,
) -> None:
    """The pair served in this process with --concurrency slots, timed by as many clients as --url times a
    server (`ks`: -k as given, None if not; `draft_model` None: the target's own MTP layers draft, as
    `settings.mtp` says)."""
    from ollama_spec.cli.bench_server import served_k, served_pair

    concurrency = options["concurrency"]
    k = served_k(ks, target_model.params)
    drafter = draft_model.name if draft_model else MTP
    with served_pair(target_model, draft_model, settings, concurrency, k, notice=notice) as url:
        click.echo(
            f"serving {target_model.name} drafted by {drafter} (K={k or 'auto'}, {concurrency} slots) "
            f"in this process at {url}",
            err=True,
        )
        bench_remote(
            target_model.name,
            url,
            prompts,
            settings.max_tokens,
            settings.runs,
            settings.temperature,
            settings.seed,
            settings.warmup,
            out,
            concurrency,
        )


def bench_remote(model, url, prompts, max_tokens, runs, temperature, seed, warmup, out, concurrency) -> None:
    """Stream the prompts from the server at `url` and print (and with `out`, write) what it took."""
    from ollama_spec.bench.remote import RemoteSettings, planned_remote_units, run_remote
    from ollama_spec.bench.remote_report import format_remote, write_remote_outputs

    settings = RemoteSettings(
        url=url,
        model=model,
        max_tokens=max_tokens,
        runs=runs,
        temperature=temperature,
        seed=seed,
        warmup=warmup,
        concurrency=concurrency,
    )
    if max_tokens < 2 or runs < 1:
        raise InvalidSetting("--max-tokens must be at least 2 and --runs at least 1")
    with click.progressbar(
        length=planned_remote_units(settings, len(prompts)),
        label=f"benchmarking {url}",
        file=sys.stderr,
        show_pos=True,
        hidden=not sys.stderr.isatty(),
        item_show_func=lambda label: label,
    ) as bar:
        result = run_remote(settings, prompts, lambda label: bar.update(1, label))
    click.echo(format_remote(result))
    if out:
        paths = write_remote_outputs(result, Path(out))
        click.echo(f"wrote {', '.join(str(p) for p in paths)}", err=True)
