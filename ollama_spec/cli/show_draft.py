"""`--show-draft`: the text of accepted draft tokens in colour on a terminal, the target's own plain."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click
from click.globals import resolve_color_default

from ollama_spec.prompting.text_stream import Run

if TYPE_CHECKING:
    from ollama_spec.engine.generation import Generation

DRAFT_COLOUR = "green"  # readable on dark and light backgrounds alike


def colour_on() -> bool:
    """Colour where click would keep it (standard output is a terminal, or a test forces it), and
    never with NO_COLOR set to anything (no-color.org)."""
    if os.environ.get("NO_COLOR"):
        return False
    # click.echo's own test, looked up at call time (CliRunner's color=True replaces it)
    return not click.utils.should_strip_ansi(sys.stdout, resolve_color_default())


def legend(colour: bool) -> str:
    """The one line on stderr that says what the colour means, or why there is none."""
    if not colour:
        why = "NO_COLOR is set" if os.environ.get("NO_COLOR") else "standard output is not a terminal"
        return f"note: --show-draft colours nothing: {why}"
    return f"{click.style(DRAFT_COLOUR, fg=DRAFT_COLOUR)}: accepted from the draft; plain: the target's own tokens"


def styled(run: Run) -> str:
    return click.style(run.text, fg=DRAFT_COLOUR) if run.from_draft else run.text


def printed(generation: Generation, colour: bool) -> Iterator[str]:
    """What to print of a generation, piece by piece: its text, or with `colour` its runs styled.
    Closing it closes the generation (Ctrl-C in chat keeps what was accepted)."""
    return _styled(generation.pieces()) if colour else iter(generation)


def _styled(runs: Iterator[Run]) -> Iterator[str]:
    try:
        for run in runs:
            yield styled(run)
    finally:
        runs.close()
