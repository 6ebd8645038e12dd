"""Options shared by several commands."""

from __future__ import annotations

import json
from typing import Any

import click

from ..store import Store, find_store_root

models_dir_option = click.option(
    "--models-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Ollama model store to read (default: $OLLAMA_MODELS, then ~/.ollama/models, "
    "then /usr/share/ollama/.ollama/models).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")


def open_store(models_dir: str | None) -> Store:
    return Store(find_store_root(models_dir))


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


class DraftLength(click.ParamType):
    """`-k`: a positive number of draft tokens, or `auto` (None: chosen each step from measured costs)."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            return None
        try:
            return int(value)
        except ValueError:
            self.fail(f"expected a number of draft tokens or 'auto', got {value!r}", param, ctx)
