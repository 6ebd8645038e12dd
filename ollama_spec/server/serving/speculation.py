"""The speculation summary: who drafted and what it did for one answer, the extension field every
response carries."""

from __future__ import annotations

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.proposer_table import MTP, PROPOSERS, head_source
from ollama_spec.engine.engine import Engine, Result


def proposer_name(engine: Engine, speculation: SpeculationSettings) -> str | None:
    """Who drafts: the draft model's name, "ngram" for prompt lookup (--draft ngram), "mtp" for the target's
    own MTP layers, or None."""
    source = head_source(speculation.proposer, engine.settings.mtp)
    if PROPOSERS[source].needs_nextn:  # where they were let go (engine/mtp_default.py), nobody drafts
        return MTP if engine.settings.mtp else None
    if not PROPOSERS[source].needs_draft:  # draftless: named by its proposer
        return source
    return engine.draft_model.name if engine.draft_model else None


def loaded_why(engine: Engine, planned: str) -> str:
    """Why this draft, as loaded: `planned` (the pair's choice), unless the engine let the target's MTP layers
    chosen by default go (engine/mtp_default.py); then the target alone, and why."""
    let_go = engine.settings.mtp_let_go
    return f"the target alone: {let_go}" if let_go else planned


def summary(engine: Engine, speculation: SpeculationSettings, result: Result) -> dict:
    """The `speculation` extension field every response carries."""
    spec = result.speculation
    return {
        "draft": proposer_name(engine, speculation),
        "num_speculative_tokens": (
            speculation.num_speculative_tokens if engine.proposer(speculation) is not None else 0
        ),
        "drafted_tokens": spec.drafted,
        "accepted_tokens": spec.accepted,
        "acceptance_rate": round(spec.acceptance_rate, 4),
        "tokens_per_target_pass": round(spec.mean_accepted_per_step, 3),
        "tokens_per_second": round(result.tokens_per_second, 2),
        "prompt_tokens": result.prompt_tokens,
        "prompt_cached_tokens": spec.prompt_cached,
        "time_to_first_token_s": round(result.first_token_seconds, 4),
        "total_s": round(result.total_seconds, 4),
    } | ({"warnings": list(result.warnings)} if result.warnings else {})
