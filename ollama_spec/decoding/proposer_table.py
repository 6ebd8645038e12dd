"""The draft sources, in one registry: each source's name, what it needs, how its proposer is built and
whether `--draft auto` may choose it. Whoever builds a proposer (the engine, the loop given a bare draft
model) builds it from `PROPOSERS` (or, where an EAGLE-3 head drafts in place of a draft model, from
`HEAD_PROPOSERS`, under the same names), and whoever reads a draft as a user named it (--draft, --pair
TARGET=DRAFT, a preset's DRAFT line) asks `named_source` and `is_auto` here, so a new source is one
entry, not a string compared in every module that chooses. A source that drafts with the target's own MTP
(NextN) layers (`needs_nextn`) is built over a sequence of the MTP head the engine loads for it, as an
EAGLE-3 head's proposer is: the two read the target's state the same way."""

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

# Where a draft is named: the best source `auto` may choose for the target (a draft model the target's
# manifest carries, else the target's own MTP layers, else the store's best-sized compatible draft).
AUTO = "auto"
MTP = "mtp"  # the target's own MTP (NextN) layers
MTP_HYBRID = "mtp+ngram"  # those beside n-gram lookup (--draft mtp --ngram)


@dataclass(frozen=True)
class ProposerKind:
    """One draft source. `build` makes its proposer from (the drafter, the target's vocabulary size,
    draft_p_min, ngram_size); `needs_draft`: it drafts with a loaded drafter (a draft model, a head, the
    target's NextN layers), so without one there is no proposer; `needs_nextn`: its drafter is the target's
    own MTP (NextN) layers, loaded with the target (EngineSettings.mtp); `auto`: `--draft auto` may choose
    it; `named`: a user names it where a draft model is named (`--draft ngram`); `describe`: what it is, in
    a few words."""

    build: Callable[[Model, int, float, int], Proposer]
    needs_draft: bool
    auto: bool = False
    named: bool = False
    describe: str = ""
    needs_nextn: bool = False


class MtpProposer(Eagle3Proposer):
    """An EAGLE-3 head's proposer over a sequence of the MTP head, its tokens labelled as the MTP layers'."""

    source = MTP


PROPOSERS: dict[str, ProposerKind] = {
    DRAFT: ProposerKind(
        lambda draft, vocab, p_min, size: DraftModelProposer(draft, vocab, p_min),
        True,
        auto=True,
        describe="a draft model",
    ),
    NGRAM: ProposerKind(
        lambda draft, vocab, p_min, size: NgramProposer(size),
        False,
        named=True,
        describe="n-gram prompt lookup",
    ),
    # each step whichever of the two is expected to get more tokens accepted (--draft MODEL --ngram)
    HYBRID: ProposerKind(
        lambda draft, vocab, p_min, size: HybridProposer(DraftModelProposer(draft, vocab, p_min), NgramProposer(size)),
        True,
        describe="a draft model and n-gram prompt lookup",
    ),
    MTP: ProposerKind(
        lambda head, vocab, p_min, size: MtpProposer(head, vocab, p_min),
        True,
        auto=True,
        named=True,
        describe="the target's own MTP (NextN) layers",
        needs_nextn=True,
    ),
    MTP_HYBRID: ProposerKind(
        lambda head, vocab, p_min, size: HybridProposer(MtpProposer(head, vocab, p_min), NgramProposer(size)),
        True,
        describe="the target's own MTP (NextN) layers and n-gram prompt lookup",
        needs_nextn=True,
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
    MTP: PROPOSERS[MTP],
    MTP_HYBRID: PROPOSERS[MTP_HYBRID],
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
    """The proposer registered as `name` over `draft` (with `head`, a sequence of an EAGLE-3 or MTP head: the
    name's entry in HEAD_PROPOSERS); None where it needs a drafter and has none, or the target's NextN
    layers and `draft` is no head over them."""
    kind = (HEAD_PROPOSERS if head else PROPOSERS)[name]
    if kind.needs_draft and draft is None or kind.needs_nextn and not head:
        return None
    return kind.build(draft, target_vocab, draft_p_min, ngram_size)


def head_source(name: str, mtp: bool) -> str:
    """The entry a loaded head drafts under for a request's source `name`: where the head is the target's
    own MTP layers (`mtp`), a plain draft (beside n-gram lookup or not) is theirs, labelled as theirs."""
    if mtp and name in (DRAFT, HYBRID):
        return MTP if name == DRAFT else MTP_HYBRID
    return name


def needs_nextn(source: str | None) -> bool:
    """Whether the source drafts with the target's own MTP (NextN) layers: the engine loads them for it."""
    kind = PROPOSERS.get(source) if source is not None else None
    return kind is not None and kind.needs_nextn


def named_source(draft: str | None) -> str | None:
    """The source a draft's name names by itself (`--draft ngram`), whatever its case; None for a model's
    name, `auto` or no name."""
    kind = PROPOSERS.get((draft or "").lower())
    return draft.lower() if kind is not None and kind.named else None


def is_auto(draft: str | None) -> bool:
    """Whether a draft's name asks for `auto`'s choice."""
    return (draft or "").lower() == AUTO


def proposer_for(draft: str | None, *, with_ngram: bool = False) -> str:
    """The source that drafts for a draft named `draft`: the one it names, else the draft model; a drafter
    (a draft model, a head, the target's MTP layers) beside n-gram lookup where `with_ngram` (--ngram) asks
    for both."""
    source = named_source(draft)
    if source is not None and not PROPOSERS[source].needs_draft:
        return source
    return HYBRID if with_ngram else source or DRAFT


def is_lookup(source: str | None) -> bool:
    """Whether a step's tokens (Proposer.source) came from a registered source that needs no draft model:
    proposals free to make, which say nothing of a draft model's acceptance."""
    kind = PROPOSERS.get(source) if source is not None else None
    return kind is not None and not kind.needs_draft
