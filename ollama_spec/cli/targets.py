"""The models a command runs: the target with its -f preset laid over it, and the draft to load."""

from __future__ import annotations

import click

from ollama_spec.engine.pairing import STORED, choose_draft
from ollama_spec.models.heads import head_facts
from ollama_spec.models.modelfile import Modelfile
from ollama_spec.models.presets import lay_preset
from ollama_spec.models.resolve import ResolvedModel


def apply_preset(model: ResolvedModel, preset: Modelfile | None) -> ResolvedModel:
    """The target with the -f preset laid over it (models/presets.py), its notes on stderr."""
    return lay_preset(model, preset, lambda text: click.echo(f"note: {text}", err=True))


def resolve_draft(draft: str | None, models_dir: str | None, target: ResolvedModel) -> ResolvedModel | None:
    """The draft model to load, as engine/pairing chooses it for every face: none for a draftless source
    (n-gram lookup); without --draft, the draft the target's manifest carries (Ollama's DRAFT), if any;
    `auto` prefers that one, else picks one from the store and says which."""
    choice = choose_draft(target, draft, models_dir=models_dir)
    if choice.how == STORED:
        click.echo(f"note: drafting with the draft stored in {target.name}'s manifest", err=True)
    elif choice.pick is not None:
        pick, facts = choice.pick, head_facts(choice.pick.info)
        if facts is not None and pick.made_for_target:
            click.echo(
                f"draft: {pick.name} (auto: the EAGLE-3 head made for this target; it {facts.describe()})", err=True
            )
        else:
            note = f"; {pick.note}" if pick.note else ""
            click.echo(f"draft: {pick.name} (auto: 1:{pick.ratio:.0f} of the target's size{note})", err=True)
    return choice.model


def check_draft_flags(*, show_draft: bool, ngram: bool, speculative: bool, draft_model: ResolvedModel | None) -> None:
    """Flags that mean something only beside a draft: a usage error without one."""
    if show_draft and not speculative:
        raise click.UsageError("--show-draft needs --draft: without one the target writes every token")
    if ngram and draft_model is None:
        raise click.UsageError(
            "--ngram needs --draft: it looks the text up beside a draft model (lookup alone: --draft ngram)"
        )
