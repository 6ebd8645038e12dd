"""The models a command runs: the target with its -f preset laid over it, and the draft to load."""

from __future__ import annotations

import click

from ollama_spec.engine.engine import EngineSettings
from ollama_spec.engine.pairing import AUTO_PICK, STORED, DraftChoice, choose_draft
from ollama_spec.models.gguf_info import ModelInfo
from ollama_spec.models.heads import head_facts
from ollama_spec.models.modelfile import Modelfile
from ollama_spec.models.presets import lay_preset
from ollama_spec.models.resolve import ResolvedModel


def apply_preset(model: ResolvedModel, preset: Modelfile | None) -> ResolvedModel:
    """The target with the -f preset laid over it (models/presets.py), its notes on stderr."""
    return lay_preset(model, preset, lambda text: click.echo(f"note: {text}", err=True))


def resolve_draft(draft: str | None, models_dir: str | None, target: ResolvedModel) -> DraftChoice:
    """The draft, as engine/pairing chooses it for every face (`.model`: the draft model to load, none for a
    draftless source or the target's MTP layers, `.mtp`: load those); without --draft, the draft the target's
    manifest carries (Ollama's DRAFT), else its own MTP layers, if any; `auto` prefers those, else picks one
    from the store and says which."""
    choice = choose_draft(target, draft, models_dir=models_dir, said=f"--draft {draft}")
    if choice.how == STORED:
        click.echo(f"note: drafting with the draft stored in {target.name}'s manifest", err=True)
    elif choice.mtp and choice.how == AUTO_PICK:
        click.echo(f"draft: {choice.why} (--draft NAME to draft otherwise)", err=True)
    elif choice.pick is not None:
        pick, facts = choice.pick, head_facts(choice.pick.info)
        if facts is not None and pick.made_for_target:
            click.echo(
                f"draft: {pick.name} (auto: the EAGLE-3 head made for this target; it {facts.describe()})", err=True
            )
        else:
            note = f"; {pick.note}" if pick.note else ""
            click.echo(f"draft: {pick.name} (auto: 1:{pick.ratio:.0f} of the target's size{note})", err=True)
    return choice


def drafter_name(choice: DraftChoice, settings: EngineSettings) -> str | None:
    """Who drafts for an engine loaded with `settings` as `choice` says: the draft model, the draftless
    source, "mtp" (None where the MTP layers chosen by default were let go: engine/mtp_default.py)."""
    if choice.model is not None:
        return choice.model.name
    return None if choice.mtp and not settings.mtp else choice.source


def mtp_note(info: ModelInfo) -> str:
    """What `check` and `drafts` say of a target that carries MTP (NextN) layers."""
    count = info.nextn_layers
    return f"the target carries {count} MTP (NextN) layer{'s' if count != 1 else ''} that draft for it (--draft mtp)"


def check_draft_flags(*, show_draft: bool, ngram: bool, choice: DraftChoice) -> None:
    """Flags that mean something only beside a draft: a usage error without one (--ngram: without a drafter,
    a draft model or the target's MTP layers, to look the text up beside)."""
    if show_draft and choice.model is None and choice.source is None:
        raise click.UsageError("--show-draft needs --draft: without one the target writes every token")
    if ngram and choice.model is None and not choice.mtp:
        raise click.UsageError(
            "--ngram needs --draft: it looks the text up beside a draft model (lookup alone: --draft ngram)"
        )
