"""`ollama-spec pull`: models into Ollama's store."""

from __future__ import annotations

import click

from ollama_spec.cli.options import json_option, models_dir_option_with
from ollama_spec.pull import VIAS, PullSettings, make_reporter, pull_models
from ollama_spec.pull.settings import DEFAULT_CONCURRENCY


@click.command()
@click.argument("models", nargs=-1, required=True)
@click.option(
    "--via",
    type=click.Choice(VIAS),
    default=None,
    help="Force a path: the Ollama daemon, the registry's HTTP API, or the Hugging Face Hub's API "
    "(default: the daemon if it answers at OLLAMA_HOST, else the registry named in the model; "
    "hf with HF_ENDPOINT set, or for gated repos read with your Hugging Face token).",
)
@click.option("--insecure", is_flag=True, help="Talk plain HTTP to the registry (local or private registries).")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 32),
    default=DEFAULT_CONCURRENCY,
    show_default=True,
    help="Blobs downloaded at once.",
)
@models_dir_option_with(
    "Store to pull into, straight from the registry (default: $OLLAMA_MODELS, then ~/.ollama/models)."
)
# OLLAMA_HOST is read by PullSettings, trimmed of spaces and quotes as Ollama does (not raw, as envvar= would)
@click.option("--host", "ollama_host", default=None, help="Ollama daemon [env: OLLAMA_HOST].")
@json_option
def pull(
    models: tuple[str, ...],
    via: str | None,
    insecure: bool,
    concurrency: int,
    models_dir: str | None,
    ollama_host: str | None,
    as_json: bool,
) -> None:
    """Pull MODELS into Ollama's store, exactly as 'ollama pull' lays them out.

    Through the Ollama daemon when one answers at OLLAMA_HOST (default http://127.0.0.1:11434);
    otherwise straight from the registry named in the model (registry.ollama.ai by default),
    each blob verified by sha256 before it enters the store and the manifest written last.
    hf.co/<user>/<repo>:<quant> names come from hf.co's Ollama registry, as with 'ollama pull'
    (default quant Q4_K_M). Busy servers and dropped connections are retried; an interrupted
    download resumes where it stopped on the next pull.

    \b
    Examples:
      ollama-spec pull llama3.1:70b llama3.2:1b
      ollama-spec pull hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q8_0
      ollama-spec pull --via registry --models-dir /data/ollama qwen2.5-coder:7b
      ollama-spec pull --insecure localhost:5000/library/mymodel:latest --json
    """
    settings = PullSettings(via=via, insecure=insecure, concurrency=concurrency, ollama_host=ollama_host)
    reporter = make_reporter(as_json)
    try:
        taken = pull_models(models, settings, reporter, models_dir)
    except KeyboardInterrupt:
        click.echo(
            "pull interrupted; finished blobs and partial downloads are kept: run the same pull to resume", err=True
        )
        click.get_current_context().exit(130)
    finally:
        close = getattr(reporter, "close", None)
        if close:
            close()
    if not as_json:
        for name, via_taken in taken:
            click.echo(f"pulled {name} (via {via_taken})", err=True)
