"""What most commands share beside their options: the store they read, JSON out, notes on stderr."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from ollama_spec.models.store import Store


def open_store(models_dir: str | None) -> Store:
    from ollama_spec.models.store import Store, find_store_root  # loaded when a command reads the store

    return Store(find_store_root(models_dir))


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


def notice(text: str) -> None:
    """A note on stderr about something that takes a moment (the engine's `notice`)."""
    click.echo(f"note: {text}", err=True)
