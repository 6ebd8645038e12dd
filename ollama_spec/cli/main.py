"""The command group and the one error boundary: core errors become one-line messages.

Each command's module is imported when the command runs, not before: `ollama-spec --help` lists the
commands from COMMANDS alone, and `ollama-spec list` never loads what `serve` needs (fastapi) or what
`generate` needs (llama.cpp).
"""

from __future__ import annotations

import importlib

import click

from ollama_spec import __version__
from ollama_spec.errors import OllamaSpecError, one_line

# name -> (module, the command's function there, the first sentence of its help; tests/cli/test_main.py
# holds each summary to its command's docstring)
COMMANDS = {
    "bench": (
        "ollama_spec.cli.bench",
        "bench",
        "Measure how much faster speculative decoding makes TARGET, and at which K.",
    ),
    "chat": ("ollama_spec.cli.chat", "chat", "Chat with TARGET, drafted by --draft, in the model's chat template."),
    "check": (
        "ollama_spec.cli.check",
        "check",
        "Check that TARGET (and --draft) fit in GPU memory before loading anything.",
    ),
    "demo-store": (
        "ollama_spec.cli.inspect",
        "demo_store",
        "Build the synthetic demo models into an Ollama-layout store at DIRECTORY.",
    ),
    "doctor": (
        "ollama_spec.cli.doctor",
        "doctor",
        "Report llama-cpp-python, GPU offload, the devices the memory check sees, and the repack verdict.",
    ),
    "drafts": (
        "ollama_spec.cli.drafts",
        "drafts",
        "List the models in the store that can draft for TARGET, smallest first.",
    ),
    "generate": (
        "ollama_spec.cli.generate",
        "generate",
        "Generate text with TARGET, drafted by --draft; PROMPT or standard input.",
    ),
    "list": ("ollama_spec.cli.inspect", "list_models", "List every model in the Ollama store, with its GGUF facts."),
    "pair": (
        "ollama_spec.cli.inspect",
        "pair",
        "Check that DRAFT can speculate for TARGET (same vocabulary rules as llama.cpp).",
    ),
    "ps": (
        "ollama_spec.cli.running",
        "ps",
        "List the models a running serve holds in memory, as `ollama ps` does, with their drafts.",
    ),
    "pull": (
        "ollama_spec.cli.pull",
        "pull",
        "Pull MODELS into Ollama's store, exactly as 'ollama pull' lays them out.",
    ),
    "rpc-server": (
        "ollama_spec.cli.rpc_server",
        "rpc_server",
        "Serve this machine's GPUs (or CPU) to a target model loaded on another machine.",
    ),
    "serve": (
        "ollama_spec.cli.serve",
        "serve",
        "Serve TARGET, drafted by --draft, over OpenAI's and Ollama's HTTP APIs; without TARGET, the whole store.",
    ),
    "show": ("ollama_spec.cli.inspect", "show", "Show a model's blob, manifest layers and GGUF header."),
    "stop": ("ollama_spec.cli.running", "stop", "Unload MODEL from a running serve now, as `ollama stop` does."),
    "vllm": (
        "ollama_spec.cli.vllm",
        "vllm",
        "Print the `vllm serve` command that serves TARGET with DRAFT speculating, or --run it.",
    ),
}

# The modules that only an optional extra brings (pyproject.toml), and that extra.
EXTRAS = {
    "fastapi": "server",
    "starlette": "server",
    "uvicorn": "server",
    "prometheus_client": "server",
    "matplotlib": "bench",
}


def missing_extra(command: str, error: ModuleNotFoundError) -> click.ClickException | None:
    """What to install when `error` is a module of an optional extra that is not installed; None otherwise."""
    extra = EXTRAS.get((error.name or "").partition(".")[0])
    if extra is None:
        return None
    return click.ClickException(f"ollama-spec {command} needs the {extra} extra: pip install 'ollama-spec[{extra}]'")


class SpecGroup(click.Group):
    """Loads each command on first use, and turns every OllamaSpecError (and Ctrl-C, and a missing
    optional extra) into a clean one-line exit."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module, function, _ = COMMANDS[name]
        try:
            return getattr(importlib.import_module(module), function)
        except ModuleNotFoundError as exc:
            if (missing := missing_extra(name, exc)) is None:
                raise
            raise missing from None

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # as click lays the list out, from the summaries: no command's module is imported for it
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        with formatter.section("Commands"):
            formatter.write_dl(
                [
                    (name, click.Command(name, help=COMMANDS[name][2]).get_short_help_str(limit))
                    for name in self.list_commands(ctx)
                ]
            )

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except OllamaSpecError as exc:
            raise click.ClickException(one_line(str(exc))) from None
        except ModuleNotFoundError as exc:  # an extra's module, imported as the command runs (bench --out)
            if (missing := missing_extra(ctx.invoked_subcommand or "", exc)) is None:
                raise
            raise missing from None
        except KeyboardInterrupt:
            click.echo("Interrupted.", err=True)
            ctx.exit(130)
        except BrokenPipeError:
            ctx.exit(0)


@click.group(cls=SpecGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="ollama-spec")
def cli() -> None:
    """Speculative decoding for the models Ollama already pulled.

    A small draft model proposes tokens, the big target model checks them all in one pass:
    same output as the target alone, several times fewer passes over its weights.

    \b
    Examples:
      ollama-spec list
      ollama-spec pair llama3.1:70b llama3.2:1b
      ollama-spec generate llama3.1:70b --draft llama3.2:1b "Why is the sky blue?"
    """
