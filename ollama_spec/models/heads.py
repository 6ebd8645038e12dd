"""EAGLE-3 draft heads: what a head's GGUF says about the target it was made for, and whether a target fits it.

A head (`general.architecture = eagle3`, src/models/eagle3.cpp) is one decoder layer fed with the inputs of
three of its target's layers (`eagle3.target_layers`, each below the target's layer count, or equal to it for
the final pre-norm state) through `fc`, whose input is 3 x `eagle3.target_hidden_size` wide. It may borrow the
target's token embeddings and output matrix, and with `d2t` it predicts over a smaller vocabulary whose ids map
to absolute target ids. A head made for another width, depth or vocabulary would load and then read rows of
the wrong size or ids past the vocabulary: these rules refuse it from the headers alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ollama_spec.models.gguf_info import ModelInfo, TensorInfo

if TYPE_CHECKING:
    import numpy as np

EAGLE3_ARCH = "eagle3"
HEAD_TARGET_LAYERS = 3  # llama.cpp refuses a head that does not list exactly three


@dataclass(frozen=True)
class HeadFacts:
    """What an EAGLE-3 head's header says about its target."""

    target_layers: tuple[int, ...] | None  # the layers whose inputs it reads; None when the header has none
    target_hidden_size: int | None
    draft_vocab_size: int | None  # rows of d2t (or of its own output matrix); None: the target's vocabulary
    has_d2t: bool
    own_embeddings: bool  # its own token_embd; otherwise it borrows the target's
    own_output: bool  # its own output matrix; otherwise it borrows the target's
    made_for: str | None = None  # the target's general.name when the converter recorded it (general.base_model)

    def made_for_model(self, target: ModelInfo) -> bool:
        """Made for this very model (any quantization of it), as far as the header says: the name recorded at
        conversion is the target's; a head that records none is taken at its shape's word."""
        return self.made_for is None or self.made_for == target.name

    def describe(self) -> str:
        """`reads target layers [2, 16, 29], 4096 wide; 32,000-token draft vocabulary (d2t)`."""
        layers = list(self.target_layers) if self.target_layers is not None else "?"
        width = f", {self.target_hidden_size} wide" if self.target_hidden_size else ""
        vocab = (
            f"; {self.draft_vocab_size:,}-token draft vocabulary{' (d2t)' if self.has_d2t else ''}"
            if self.draft_vocab_size
            else ""
        )
        made_for = f"; converted for {self.made_for}" if self.made_for else ""
        return f"reads target layers {layers}{width}{vocab}{made_for}"


def is_head(info: ModelInfo) -> bool:
    """True for an EAGLE-3 head's GGUF."""
    return info.is_eagle3_head


def head_facts(info: ModelInfo) -> HeadFacts | None:
    """The head facts of `info`, or None when it is no EAGLE-3 head."""
    if not is_head(info):
        return None
    meta = info.metadata
    layers = meta.get(f"{EAGLE3_ARCH}.target_layers")
    width = meta.get(f"{EAGLE3_ARCH}.target_hidden_size")
    tensors = {t.name: t for t in info.tensors}
    d2t, output = tensors.get("d2t"), tensors.get("output.weight")
    vocab = d2t.shape[0] if d2t is not None else (output.shape[1] if output is not None and output.shape[1:] else None)
    return HeadFacts(
        target_layers=tuple(layers) if isinstance(layers, tuple) and all(_whole(v) for v in layers) else None,
        target_hidden_size=width if _whole(width) else None,
        draft_vocab_size=vocab,
        has_d2t=d2t is not None,
        own_embeddings="token_embd.weight" in tensors,
        own_output=output is not None,
        made_for=made_for if isinstance(made_for := meta.get("general.base_model.0.name"), str) else None,
    )


def head_problems(target: ModelInfo, head: ModelInfo) -> list[str]:
    """Why `head` cannot draft for `target` (empty when it can): width, layers and vocabulary."""
    facts = head_facts(head)
    if facts is None:
        return []
    problems = []
    if head.block_count != 1:
        problems.append(f"the head has {head.block_count or 'no'} layers (eagle3.block_count); an EAGLE-3 head has 1")
    if facts.target_layers is None:
        problems.append("the head names no target layers (eagle3.target_layers)")
    elif len(facts.target_layers) != HEAD_TARGET_LAYERS:
        problems.append(
            f"the head reads {len(facts.target_layers)} target layers {list(facts.target_layers)}; "
            f"an EAGLE-3 head reads exactly {HEAD_TARGET_LAYERS}"
        )
    elif target.block_count is not None and max(facts.target_layers) > target.block_count:
        problems.append(
            f"the head reads target layers {list(facts.target_layers)} but the target has {target.block_count} "
            "layers: it was made for a deeper model"
        )
    if facts.target_hidden_size is None:
        problems.append("the head names no target width (eagle3.target_hidden_size)")
    elif facts.target_hidden_size != target.embedding_length:
        problems.append(
            f"the head was made for a target {facts.target_hidden_size} wide; this target is "
            f"{target.embedding_length} wide (embedding_length)"
        )
    problems += _vocabulary_problems(target, head, facts)
    return problems


def _vocabulary_problems(target: ModelInfo, head: ModelInfo, facts: HeadFacts) -> list[str]:
    n_vocab = target.vocab_size
    tensors = {t.name: t for t in head.tensors}
    problems = []
    embd = tensors.get("token_embd.weight")
    if embd is not None and embd.shape[1:] and embd.shape[1] != n_vocab:
        problems.append(f"the head's token embeddings have {embd.shape[1]} rows; the target has {n_vocab} tokens")
    if facts.draft_vocab_size is not None and facts.draft_vocab_size > n_vocab:
        problems.append(
            f"the head predicts over {facts.draft_vocab_size} tokens; the target has only {n_vocab}: "
            "it was made for another vocabulary"
        )
    elif facts.own_output and not facts.has_d2t and facts.draft_vocab_size != n_vocab:
        problems.append(
            f"the head's output has {facts.draft_vocab_size} rows and no d2t map; the target has {n_vocab} tokens"
        )
    elif facts.has_d2t:
        ids = read_d2t(head, tensors["d2t"])
        if ids is None:
            problems.append("the head's d2t map is not I64 token ids")
        elif ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
            problems.append(
                f"the head's d2t map names token {int(ids.max())}; the target has {n_vocab} tokens: "
                "it was made for another vocabulary"
            )
    return problems


def read_d2t(head: ModelInfo, tensor: TensorInfo) -> np.ndarray | None:
    """The head's d2t map (absolute target ids, one per draft token) read from its file; None unless I64."""
    if tensor.type_name != "I64" or len(tensor.shape) != 1:
        return None
    import numpy as np  # only here: `list` and `show` start without numpy

    return np.fromfile(head.path, dtype="<i8", count=tensor.shape[0], offset=head.data_offset + tensor.offset)


def _whole(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
