"""The proposers by name (SpeculationSettings.proposer): whoever builds one (the engine, the loop given
a bare draft model) builds it from `PROPOSERS`, and whoever asks what a name needs asks it here, so a
new proposer is one entry, not a string compared in every module that chooses."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ollama_spec.decoding.eagle3 import Eagle3Proposer
from ollama_spec.decoding.proposers import (
    DEFAULT_NGRAM_SIZE,
    DRAFT,
    HYBRID,
    NGRAM,
    DraftModelProposer,
    HybridProposer,
    Model,
    NgramProposer,
    Proposer,
)


@dataclass(frozen=True)
class ProposerKind:
    """How a named proposer is built, from (the draft model, the target's vocabulary size, draft_p_min,
    ngram_size); `needs_draft`: it drafts with the draft model, so without one there is no proposer."""

    build: Callable[[Model, int, float, int], Proposer]
    needs_draft: bool


PROPOSERS: dict[str, ProposerKind] = {
    DRAFT: ProposerKind(lambda draft, vocab, p_min, size: DraftModelProposer(draft, vocab, p_min), True),
    NGRAM: ProposerKind(lambda draft, vocab, p_min, size: NgramProposer(size), False),
    # each step whichever of the two is expected to get more tokens accepted (--draft MODEL --ngram)
    HYBRID: ProposerKind(
        lambda draft, vocab, p_min, size: HybridProposer(DraftModelProposer(draft, vocab, p_min), NgramProposer(size)),
        True,
    ),
}
# The same names where an EAGLE-3 head drafts in place of a draft model (built over one sequence of a
# loaded head): "draft" is the head's, "draft+ngram" the head's or the lookup's each step.
HEAD_PROPOSERS: dict[str, ProposerKind] = {
    DRAFT: ProposerKind(lambda head, vocab, p_min, size: Eagle3Proposer(head, vocab, p_min), True),
    NGRAM: PROPOSERS[NGRAM],
    HYBRID: ProposerKind(
        lambda head, vocab, p_min, size: HybridProposer(Eagle3Proposer(head, vocab, p_min), NgramProposer(size)),
        True,
    ),
}


def build_proposer(
    name: str,
    draft: Model | None,
    target_vocab: int,
    *,
    draft_p_min: float = 0.0,
    ngram_size: int = DEFAULT_NGRAM_SIZE,
    head: bool = False,
) -> Proposer | None:
    """The proposer registered as `name` over `draft` (with `head`, a sequence of an EAGLE-3 head: the
    name's entry in HEAD_PROPOSERS); None where it needs a draft model and has none."""
    kind = (HEAD_PROPOSERS if head else PROPOSERS)[name]
    return None if kind.needs_draft and draft is None else kind.build(draft, target_vocab, draft_p_min, ngram_size)
