"""The tiny target with a vocabulary changed at its end: padded past its draft's, or with a code model's
fill-in-the-middle tokens."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ollama_spec.synthetic.catalog import PAIRS
from ollama_spec.synthetic.layout import write_model
from ollama_spec.synthetic.models import make_weights, write_gguf
from ollama_spec.synthetic.tokenizer import CONTROL, Vocabulary, build_vocabulary

# A target whose vocabulary is padded past its draft's, as Qwen2.5 7B+ (152,064) pads past
# 0.5B-3B (151,936): the tiny target with 64 unused tokens more, drafted for by tiny-draft.
PADDED_NAME = "tiny-padded"
PADDING_TOKENS = 64
UNUSED_TOKEN = 5  # gguf.TokenType.UNUSED


def build_padded_target(root: Path, extra: int = PADDING_TOKENS) -> str:
    """Write the tiny target with `extra` padding tokens into `root`; return its name.

    Its first layers, embeddings and output rows are tiny-target's (numpy draws the same values
    for the shared rows), and the padding rows are as likely as any other, so the target does
    emit ids that tiny-draft lacks.
    """
    spec = PAIRS["tiny"]
    vocab = build_vocabulary(spec.vocab_size, spec.n_merges)
    padded = Vocabulary(
        vocab.tokens + tuple(f"[PAD{vocab.size + i}]" for i in range(extra)),
        vocab.token_types + (UNUSED_TOKEN,) * extra,
        vocab.merges,
    )
    weights = make_weights(spec.arch, padded.size, spec.recipe, spec.draft_layers)
    with tempfile.TemporaryDirectory(dir=root, prefix=".staging-") as tmp:
        path = Path(tmp) / "model.gguf"
        write_gguf(
            path,
            name=PADDED_NAME,
            arch=spec.arch,
            n_layer=spec.arch.n_layer,
            vocab=padded,
            weights=weights,
            dtype=spec.recipe.dtype,
        )
        write_model(root, PADDED_NAME, path)
    return PADDED_NAME


CODER_NAME = "tiny-coder"
FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")


def build_coder_target(root: Path) -> str:
    """Write the tiny target with a code model's fill-in-the-middle markers (three control tokens
    past its vocabulary, named in the GGUF as Qwen2.5-Coder's are) into `root`; return its name."""
    spec = PAIRS["tiny"]
    vocab = build_vocabulary(spec.vocab_size, spec.n_merges)
    coder = Vocabulary(vocab.tokens + FIM_TOKENS, vocab.token_types + (CONTROL,) * len(FIM_TOKENS), vocab.merges)
    weights = make_weights(spec.arch, coder.size, spec.recipe, spec.draft_layers)
    with tempfile.TemporaryDirectory(dir=root, prefix=".staging-") as tmp:
        path = Path(tmp) / "model.gguf"
        write_gguf(
            path,
            name=CODER_NAME,
            arch=spec.arch,
            n_layer=spec.arch.n_layer,
            vocab=coder,
            weights=weights,
            dtype=spec.recipe.dtype,
            fim_ids=(vocab.size, vocab.size + 1, vocab.size + 2),
        )
        write_model(root, CODER_NAME, path)
    return CODER_NAME
