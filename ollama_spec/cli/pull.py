"""`ollama-spec pull`: models into Ollama's store."""

from __future__ import annotations

import click

from ollama_spec.cli.options import json_option, models_dir_option_with
from ollama_spec.pull import VIAS, PullSettings, make_reporter, pull_head_model, pull_models
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
@click.option(
    "--head-for",
    "head_for",
    metavar="TARGET",
    default=None,
    help="MODEL is an EAGLE-3 head checkpoint (hf.co/<user>/<repo> or a folder with config.json and "
    "safetensors or pytorch_model.bin) made for TARGET, a model in the store: convert it to GGUF and store it.",
)
@click.option("--name", "store_name", default=None, help="With --head-for: the name to store the head as.")
@json_option
def pull(
    models: tuple[str, ...],
    via: str | None,
    insecure: bool,
    concurrency: int,
    models_dir: str | None,
    ollama_host: str | None,
    head_for: str | None,
    store_name: str | None,
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
      ollama-spec pull hf.co/yuhuili/EAGLE3-LLaMA3.1-Instruct-8B --head-for llama3.1:8b
      ollama-spec pull ./my-eagle3-head --head-for llama3.1:8b --name llama3.1-eagle3:8b

    With --head-for TARGET, MODEL is an EAGLE-3 draft head's checkpoint (EAGLE's own layout or vLLM
    speculators'), from the Hugging Face Hub or a folder: it is converted to GGUF without torch, checked
    against TARGET (its width, layers and vocabulary) and loaded once by llama.cpp, then stored beside
    TARGET like any pulled model. Use it with --draft NAME (or --draft auto, which prefers it).
    """
    settings = PullSettings(via=via, insecure=insecure, concurrency=concurrency, ollama_host=ollama_host)
    if store_name and not head_for:
        raise click.UsageError("--name goes with --head-for")
    if head_for and len(models) != 1:
        raise click.UsageError("--head-for converts one head at a time: name one MODEL")
    reporter = make_reporter(as_json)
    try:
        taken = _pull(models, settings, reporter, models_dir, head_for, store_name)
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


def _pull(
    models: tuple[str, ...],
    settings: PullSettings,
    reporter,
    models_dir: str | None,
    head_for: str | None,
    store_name: str | None,
) -> list[tuple[str, str]]:
    """Pull the models (or convert the one head for `head_for`); (name, the way it came) for each."""
    if head_for:
        from ollama_spec.llama.probe import probe_model  # llama.cpp loads the converted head once

        name = pull_head_model(models[0], head_for, settings, reporter, models_dir, name=store_name, verify=probe_model)
        return [(name, "conversion")]
    return pull_models(models, settings, reporter, models_dir)
