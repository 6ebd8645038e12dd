"""The `ollama-spec` command line. `main` is the console-script entry point."""

from ollama_spec.cli.main import cli


def main() -> None:
    cli(prog_name="ollama-spec")


__all__ = ["cli", "main"]
