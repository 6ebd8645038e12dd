"""Draft discovery: which models in the store can draft for a target, and which one pays best.

A draft is read once per proposed token and the target once per step, so what a draft costs is
its size next to the target's (bytes of weights read, file sizes here). A draft about 1:20 to
1:50 of the target (Llama 3.2 1B for a 70B) is the useful range; one over a tenth of the target
rarely pays, and a much smaller one agrees with the target less often.

An EAGLE-3 head made for the target (models/heads) reads the target's own hidden state, so it agrees with the
target more often than a separate model of its size: when the store has one, it is the one `auto` picks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ollama_spec.errors import OllamaSpecError
from ollama_spec.models.compat import MAX_VOCAB_SIZE_DIFFERENCE, check_compatibility
from ollama_spec.models.gguf_info import ModelInfo
from ollama_spec.models.heads import head_facts, is_head
from ollama_spec.models.store import Store, StoredModel
from ollama_spec.models.usable import usability_problems

USEFUL_RATIO = (20.0, 50.0)  # target size / draft size
MIN_RATIO = 10.0  # a draft over a tenth of the target's size rarely pays


@dataclass(frozen=True)
class DraftCandidate:
    name: str
    info: ModelInfo
    ratio: float  # target file size / draft file size
    made_for_target: bool = False  # an EAGLE-3 head converted for this very model (heads.HeadFacts.made_for)

    @property
    def is_head(self) -> bool:
        """An EAGLE-3 head that fits this target (the size rules are for separate draft models)."""
        return is_head(self.info)

    @property
    def note(self) -> str | None:
        """Why this size is outside the useful range, or None inside it; for a head, what it reads."""
        facts = head_facts(self.info)
        return f"EAGLE-3 head: {facts.describe()}" if facts else size_note(self.ratio)

    @property
    def distance(self) -> float:
        """How far (in log size) the ratio lies outside the useful range; 0 inside it (and for a head made for the
        target)."""
        if self.made_for_target:
            return 0.0
        low, high = USEFUL_RATIO
        return max(0.0, math.log(low / self.ratio), math.log(self.ratio / high))


def size_note(ratio: float) -> str | None:
    """Why a draft `ratio` times smaller than its target (target size / draft size) is outside the useful
    range, or None inside it."""
    low, high = USEFUL_RATIO
    if ratio <= 1:
        return "speculation is slower than the target alone"
    if ratio < MIN_RATIO:
        return "over a tenth of the target's size: drafting rarely pays"
    if ratio < low:
        return f"a bigger share of the target than 1:{low:.0f}: pays only when most drafts are accepted"
    if ratio > high:
        return f"a smaller share of the target than 1:{high:.0f}: cheap, but agrees with the target less often"
    return None


def find_drafts(store: Store, target: ModelInfo, knows: Callable[[str], bool]) -> list[DraftCandidate]:
    """The store's models that can draft for `target` (llama.cpp's rules), smallest first; `knows`: as
    usable.usability_problems takes it."""
    candidates = []
    for model in store.models():
        if not isinstance(model, StoredModel) or model.layer("adapter") is not None:
            continue  # unreadable manifests are `list`'s business; a LoRA model is refused as a draft
        try:
            light = model.model_info(read_vocab=False)
            if light.path == target.path or light.file_size >= target.file_size or not _may_match(target, light):
                continue
            info = model.model_info()
        except OllamaSpecError:
            continue
        if usability_problems(info, knows) or not check_compatibility(target, info).ok:
            continue
        facts = head_facts(info)
        made_for = facts is not None and facts.made_for_model(target)
        candidates.append(DraftCandidate(model.name, info, target.file_size / max(info.file_size, 1), made_for))
    return sorted(candidates, key=lambda c: (c.info.file_size, c.name))


def best_draft(candidates: list[DraftCandidate]) -> DraftCandidate | None:
    """A head made for the target, else the candidate nearest the useful size range; among equals the largest
    (it agrees most often). A head that fits the target's shape but was converted for another model (Llama 3's
    8B for Llama 3.1's) is lossless too, but is taken only as a draft model of its size would be."""
    usable = [c for c in candidates if c.ratio >= 2]  # half the target's size saves nothing
    return min(usable, key=lambda c: (not c.made_for_target, c.distance, -c.info.file_size), default=None)


def _may_match(target: ModelInfo, draft: ModelInfo) -> bool:
    """Cheap header-only pre-check before reading a whole vocabulary."""
    return (
        draft.vocab_type == target.vocab_type and abs(draft.vocab_size - target.vocab_size) <= MAX_VOCAB_SIZE_DIFFERENCE
    )
