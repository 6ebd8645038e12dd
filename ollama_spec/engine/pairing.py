"""Which draft a target gets, decided once for every face: a named source or model, else the draft the
target's manifest carries, else the target's own MTP (NextN) layers where it carries them (-k auto then
drafts with them only while they pay: K=0 is the target alone), else (where `auto` is asked for, or is the
face's default) the store's best-sized compatible draft, else the target alone."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ollama_spec.decoding.proposer_table import MTP, NGRAM, PROPOSERS, is_auto, named_source, needs_nextn
from ollama_spec.engine.load_plan import EngineSettings
from ollama_spec.errors import IncompatibleDraft, ModelNotFound, OllamaSpecError, one_line
from ollama_spec.llama.backends import llama_cpp_knows
from ollama_spec.models.architectures import drafts_with_nextn, has_recurrent_state
from ollama_spec.models.compat import require_compatible
from ollama_spec.models.drafts import DraftCandidate, best_draft, find_drafts
from ollama_spec.models.resolve import ResolvedModel, resolve_model, stored_draft_model
from ollama_spec.models.store import Store, find_store_root
from ollama_spec.models.usable import require_usable

NAMED, STORED, AUTO_PICK, ALONE = "named", "stored", "auto", "alone"  # how a choice was made


@dataclass(frozen=True)
class DraftChoice:
    """The draft model to load (None: none), the draftless source that drafts instead (`source`, e.g. n-gram
    lookup; None: the draft model, if any), how the choice was made (NAMED, STORED, AUTO_PICK, ALONE), why
    in words, and auto's pick with its size ratio where auto chose."""

    model: ResolvedModel | None
    source: str | None
    how: str
    why: str
    pick: DraftCandidate | None = None
    checked: bool = False  # found usable and compatible while choosing: the load does not check it again

    @property
    def mtp(self) -> bool:
        """The target's own MTP (NextN) layers draft: the engine loads them (EngineSettings.mtp)."""
        return needs_nextn(self.source)

    def engine_settings(self, settings: EngineSettings) -> EngineSettings:
        """`settings` as this choice loads the pair: with the target's MTP layers where they draft, and,
        where nobody named them, only where they pay (engine/mtp_default.py)."""
        return replace(settings, mtp=self.mtp, mtp_where_it_pays=self.mtp and self.how != NAMED)


def choose_draft(
    target: ResolvedModel,
    named: str | None,
    store: Store | None = None,
    *,
    models_dir: str | None = None,
    said: str = "--draft",
    auto_by_default: bool = False,
) -> DraftChoice:
    """The draft for `target`. `named`: the draft as a user named it (a model, a .gguf path, a draftless
    source, `auto`; None: not named), `said` says where (--draft, --pair T=D, a preset). Without a name,
    the target's own draft layer, else auto's choice where `auto_by_default` (serve over the whole store),
    else the target alone. `auto` asked for by name and finding nothing is ModelNotFound; as the default,
    the target alone. `store` (else the one `models_dir` names) is where auto looks and names resolve.
    A target that carries MTP (NextN) layers drafts with them unless a draft is named or stored: with or
    without `auto`, as Ollama runs them; `mtp` named for a target without usable ones is IncompatibleDraft."""
    if (source := named_source(named)) is not None:
        if needs_nextn(source) and (problem := mtp_problem(target)) is not None:
            raise IncompatibleDraft(f"{said}: {problem}")
        return DraftChoice(None, source, NAMED, f"{said}: {PROPOSERS[source].describe}")
    if named and not is_auto(named):
        model = resolve_model(named, store=store) if store is not None else resolve_model(named, models_dir)
        return DraftChoice(model, None, NAMED, f"{said}: {model.name}")
    if target.stored_draft is not None:
        return DraftChoice(stored_draft_model(target), None, STORED, "the draft layer in its manifest")
    if target.info.nextn_layers and mtp_problem(target) is None:
        # a default priced as the pair loads (engine/mtp_default.py): what was loaded is said once it has been
        count = target.info.nextn_layers
        why = f"its own MTP (NextN) layers ({count}) by default, kept as it loads where they fit and pay"
        return DraftChoice(None, MTP, AUTO_PICK, why)
    if not named and not auto_by_default:
        return DraftChoice(None, None, ALONE, "the target alone: no draft named")
    return _auto(target, store if store is not None else _store(models_dir), strict=bool(named))


def _auto(target: ResolvedModel, store: Store, *, strict: bool) -> DraftChoice:
    """The store's best-sized compatible draft; none is ModelNotFound where `strict`, else the target alone."""
    pick = best_draft(find_drafts(store, target.info, llama_cpp_knows))
    if pick is None:
        if strict:
            raise ModelNotFound(
                f"--draft auto: no model in {store.path} can draft for {target.name} "
                f"(see `ollama-spec drafts {target.name}`); try --draft {NGRAM}"
            )
        return DraftChoice(None, None, ALONE, "the target alone: no model in the store can draft for it")
    draft = resolve_model(pick.name, store=store)
    if not strict:  # a default choice that cannot draft falls back to the target alone, and says why
        try:
            require_usable(draft.name, draft.info, "draft", llama_cpp_knows)
            require_compatible(target.name, target.info, draft.name, draft.info)
        except OllamaSpecError as exc:
            return DraftChoice(None, None, ALONE, f"the target alone: {one_line(str(exc))}")
    if pick.made_for_target:
        why = f"the store's EAGLE-3 head made for it: {draft.name} ({pick.note})"
    else:
        note = f"; {pick.note}" if pick.note else ""
        why = f"the store's best compatible draft: {draft.name} (1:{pick.ratio:.0f} of its size{note})"
    return DraftChoice(draft, None, AUTO_PICK, why, pick, checked=not strict)


def mtp_problem(target: ResolvedModel) -> str | None:
    """Why `target`'s own MTP (NextN) layers cannot draft for it, from its header; None where they can."""
    info = target.info
    if not info.nextn_layers:
        return (
            f"{target.name} has no MTP (NextN) layers to draft with (GLM-4.x and DeepSeek V3 GGUFs ship "
            "them); name a draft model, or --draft ngram"
        )
    if not drafts_with_nextn(info.architecture):
        return f"llama.cpp has no MTP draft graph for {target.name}'s architecture ({info.architecture})"
    if has_recurrent_state(info.architecture):
        return (
            f"{target.name} is a recurrent or hybrid model: its cache cannot be cut back after each step, so "
            "its MTP layers cannot draft for it"
        )
    return None


def _store(models_dir: str | None) -> Store:
    return Store(find_store_root(models_dir))
