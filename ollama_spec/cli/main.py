"""The command group and the one error boundary: core errors become one-line messages."""

from __future__ import annotations

import click

from ollama_spec import __version__
from ollama_spec.errors import OllamaSpecError, one_line


class SpecGroup(click.Group):
    """Turns every OllamaSpecError (and Ctrl-C) into a clean one-line exit."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except OllamaSpecError as exc:
            raise click.ClickException(one_line(str(exc))) from None
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
