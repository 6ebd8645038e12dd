"""`ollama-spec vllm`: the `vllm serve` command for a pair, or vLLM started with it (--run)."""

from __future__ import annotations

import shlex

import click

from ollama_spec.cli.common import echo_json
from ollama_spec.cli.options import DraftLength, draft_option, json_option, preset_option_with
from ollama_spec.decoding.proposer_table import is_auto, named_source
from ollama_spec.errors import InvalidSetting
from ollama_spec.integrations.vllm import (
    DEFAULT_HOST,
    DEFAULT_K,
    DEFAULT_PORT,
    VllmCommand,
    VllmSettings,
    build_command,
    exec_vllm,
    ready_launcher,
    version_text,
)
from ollama_spec.integrations.vllm_repos import to_hf


@click.command()
@click.argument("target")
@preset_option_with(
    "A Modelfile or a shipped preset's name (e.g. llama3.1-70b): its FROM, DRAFT, "
    "num_speculative_tokens (-k) and num_ctx (vLLM's --max-model-len) are the defaults, and flags "
    "override them. Its SYSTEM and sampling PARAMETERs are not `vllm serve` options: a client "
    "sends them with each request."
)
@draft_option(names="an Ollama name or a Hugging Face org/name", auto=False, ngram=False, mtp=False, required=True)
@click.option(
    "-k",
    "--num-speculative-tokens",
    "k",
    type=DraftLength(),
    default=DEFAULT_K,
    show_default=True,
    help="Tokens the draft proposes per step (vLLM's num_speculative_tokens, a fixed number: auto means 5).",
)
@click.option(
    "--tp",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="GPUs the target is split over (--tensor-parallel-size).",
)
@click.option(
    "--draft-tp",
    type=click.IntRange(min=1),
    default=None,
    help="The draft's draft_tensor_parallel_size (default: --tp, the only value vLLM accepts for a draft model today).",
)
@click.option(
    "--host",
    default=DEFAULT_HOST,
    show_default=True,
    help="Address vLLM binds (0.0.0.0: every interface; an IPv6 one as ::1 or [::1]; vLLM asks for no key unless given "
    "--vllm-args '--api-key KEY').",
)
@click.option("--port", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True, help="vLLM's port.")
@click.option(
    "--vllm-args",
    default="",
    metavar="'ARGS'",
    help="More `vllm serve` options, in one quoted string (e.g. '--max-model-len 8192').",
)
@click.option("--run", is_flag=True, help="Start vLLM with the command (it must be installed here).")
@json_option
def vllm(target, preset, draft, k, tp, draft_tp, host, port, vllm_args, run, as_json) -> None:
    """Print the `vllm serve` command that serves TARGET with DRAFT speculating, or --run it.

    vLLM is the engine for many concurrent users and multi-GPU servers: continuous batching,
    tensor parallelism, the OpenAI API. It loads a model's original Hugging Face weights, not
    Ollama's GGUF blobs: known Ollama names (llama3.1, llama3.2, llama3.3, qwen2.5,
    qwen2.5-coder) map to their repositories, and a quantization in the tag (70b-instruct-q4_K_M)
    names the same model; any other model is given as org/name. The command needs vLLM >= 0.15
    (0.10 to 0.14 refuse draft models). It uses --speculative-config with method draft_model:
    the --speculative-model and --num-speculative-tokens flags that tutorials still show are
    gone from current vLLM.

    The command goes to stdout, notes to stderr. Measure the server like any OpenAI one:
    ollama-spec bench REPO --url http://HOST:PORT/v1.

    \b
    Examples:
      ollama-spec vllm llama3.1:70b --draft llama3.2:1b --tp 4
      ollama-spec vllm -f llama3.3-70b --tp 2 --vllm-args '--max-model-len 8192'
      ollama-spec vllm qwen2.5-coder:32b -d qwen2.5-coder:0.5b -k 4 --run
      ollama-spec vllm hugging-quants/Meta-Llama-3.1-70B-Instruct-AWQ-INT4 -d llama3.2:1b --json
    """
    settings = _settings(draft, k, tp, draft_tp, host, port, vllm_args, preset)
    command = build_command(to_hf(target), to_hf(draft), settings)
    if preset and preset.system is not None:
        click.echo(
            f"note: {preset.path.name}: SYSTEM is not a `vllm serve` option; a client sends the system "
            "message with each request",
            err=True,
        )
    needs = f"needs vLLM >= {version_text(command.min_version)}"
    if run:
        launcher = ready_launcher(command.min_version)
        _notes(command)
        click.echo(f"starting: {command.shell}", err=True)
        exec_vllm(command, launcher)
    if as_json:
        echo_json(_command_json(command))
        return
    click.echo(f"# {needs}; vLLM serves the OpenAI API at {command.url}", err=True)
    _notes(command)
    click.echo(command.shell)
    click.echo(f"# measure it: {command.bench}", err=True)


def _settings(draft: str, k: int | None, tp: int, draft_tp: int | None, host: str, port: int, vllm_args: str, preset):
    """The flags as VllmSettings; a draft vLLM cannot take refused, -k auto made the fixed default (said)."""
    if is_auto(draft) or named_source(draft) is not None:
        raise InvalidSetting(
            f"--draft {draft.lower()} is ollama-spec's own; vLLM needs a draft model by name (e.g. --draft llama3.2:1b)"
        )
    if k is None:  # -k auto, or a preset's num_speculative_tokens auto
        click.echo(
            f"note: vLLM drafts a fixed number of tokens; -k auto is ollama-spec's per-step choice, so K is "
            f"{DEFAULT_K}",
            err=True,
        )
        k = DEFAULT_K
    try:
        extra_args = tuple(shlex.split(vllm_args))
    except ValueError as exc:
        raise InvalidSetting(f"--vllm-args: {exc}") from None
    max_model_len = preset.parameters.get("num_ctx") if preset else None
    return VllmSettings(
        k=k, tp=tp, draft_tp=draft_tp, host=host, port=port, max_model_len=max_model_len, extra_args=extra_args
    )


def _command_json(command: VllmCommand) -> dict:
    return {
        "target": {"name": command.target.name, "repo": command.target.repo},
        "draft": {"name": command.draft.name, "repo": command.draft.repo},
        "command": command.shell,
        "argv": list(command.argv),
        "speculative_config": command.speculative_config,
        "min_vllm_version": version_text(command.min_version),
        "url": command.url,
        "served_model_name": command.served_name,
        "bench": command.bench,
        "notes": list(command.notes),
        "warnings": list(command.warnings),
    }


def _notes(command) -> None:
    for warning in command.warnings:
        click.echo(f"warning: {warning}", err=True)
    for note in command.notes:
        click.echo(f"note: {note}", err=True)
