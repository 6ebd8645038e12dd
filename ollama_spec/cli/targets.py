"""The models a command runs: the target with its -f preset laid over it, and the draft to load."""

from __future__ import annotations

import click

from ollama_spec.cli.common import open_store
from ollama_spec.decoding.proposer_table import NGRAM, is_auto, named_source
from ollama_spec.errors import ModelNotFound
from ollama_spec.llama.backends import llama_cpp_knows
from ollama_spec.models.drafts import best_draft, find_drafts
from ollama_spec.models.modelfile import Modelfile
from ollama_spec.models.presets import lay_preset
from ollama_spec.models.resolve import ResolvedModel, resolve_model, stored_draft_model


def apply_preset(model: ResolvedModel, preset: Modelfile | None) -> ResolvedModel:
    """The target with the -f preset laid over it (models/presets.py), its notes on stderr."""
    return lay_preset(model, preset, lambda text: click.echo(f"note: {text}", err=True))


def resolve_draft(draft: str | None, models_dir: str | None, target: ResolvedModel) -> ResolvedModel | None:
    """The draft model to load: none for n-gram lookup; without --draft, the draft the target's manifest
    carries (Ollama's DRAFT), if any; `auto` prefers that one, else picks one from the store and says which."""
    if named_source(draft) is not None:
        return None
    if (not draft or is_auto(draft)) and target.stored_draft is not None:
        click.echo(f"note: drafting with the draft stored in {target.name}'s manifest", err=True)
        return stored_draft_model(target)
    if not draft:
        return None
    if is_auto(draft):
        store = open_store(models_dir)
        choice = best_draft(find_drafts(store, target.info, llama_cpp_knows))
        if choice is None:
            raise ModelNotFound(
                f"--draft auto: no model in {store.path} can draft for {target.name} "
                f"(see `ollama-spec drafts {target.name}`); try --draft {NGRAM}"
            )
        note = f"; {choice.note}" if choice.note else ""
        click.echo(f"draft: {choice.name} (auto: 1:{choice.ratio:.0f} of the target's size{note})", err=True)
        return resolve_model(choice.name, store=store)
    return resolve_model(draft, models_dir)


def check_draft_flags(*, show_draft: bool, ngram: bool, speculative: bool, draft_model: ResolvedModel | None) -> None:
    """Flags that mean something only beside a draft: a usage error without one."""
    if show_draft and not speculative:
        raise click.UsageError("--show-draft needs --draft: without one the target writes every token")
    if ngram and draft_model is None:
        raise click.UsageError(
            "--ngram needs --draft: it looks the text up beside a draft model (lookup alone: --draft ngram)"
        )
