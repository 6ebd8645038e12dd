"""What llama.cpp assumes when a GGUF leaves out its BOS/EOS settings (src/llama-vocab.cpp).

`tokenizer.ggml.add_bos_token`, `add_eos_token` and the BOS/EOS ids are optional: llama.cpp
falls back to defaults that depend on the tokenizer model and, for BPE, on the pre-tokenizer.
Draft compatibility compares the values llama.cpp will use, so a header that omits them must
be read with the same defaults, not as "unknown".
"""

from __future__ import annotations

from dataclasses import dataclass

BPE_MODELS = ("gpt2", "hybriddna", "whitespace")
NO_VOCAB_MODELS = ("no_vocab", "none")
# BPE pre-tokenizers for which llama.cpp turns add_bos on
BPE_ADD_BOS_PRES = frozenset(
    (
        "llama3",
        "llama-v3",
        "llama-bpe",
        "falcon3",
        "falcon-h1",
        "pixtral",
        "midm-2.0",
        "lfm2",
        "jina-v5-nano",
        "tekken",
        "chameleon",
    )
)
GEMMA4_PRES = frozenset(("gemma4", "granite-embed-multi-311m"))
BPE_NO_BOS_ID_PRES = frozenset(("chatglm-bpe", "glm4", "glm5"))


@dataclass(frozen=True)
class VocabDefaults:
    add_bos: bool
    add_eos: bool
    bos_id: int | None
    eos_id: int | None


def vocab_defaults(tokenizer_model: str | None, pre_tokenizer: str | None) -> VocabDefaults:
    """llama.cpp's add-BOS/add-EOS flags and BOS/EOS ids for this tokenizer before the header's own."""
    if tokenizer_model == "llama":  # SentencePiece
        return VocabDefaults(True, False, 1, 2)
    if tokenizer_model == "bert":
        return VocabDefaults(True, False, 101, None)
    if tokenizer_model in BPE_MODELS:
        bos_id = None if pre_tokenizer in BPE_NO_BOS_ID_PRES else 11
        return VocabDefaults(pre_tokenizer in BPE_ADD_BOS_PRES, False, bos_id, 11)
    if tokenizer_model == "gemma4":
        return VocabDefaults(True, False, None, None)
    if tokenizer_model == "t5":
        return VocabDefaults(False, True, None, 1)
    if tokenizer_model == "plamo2":
        return VocabDefaults(False, False, 1, 2)
    return VocabDefaults(False, False, None, None)  # rwkv, test, none and tokenizers llama.cpp refuses


def forces_add_bos(tokenizer_model: str | None, pre_tokenizer: str | None) -> bool:
    """Gemma 4: llama.cpp adds BOS even when the header says not to (ggml-org/llama.cpp#21500)."""
    return tokenizer_model == "gemma4" or (tokenizer_model in BPE_MODELS and pre_tokenizer in GEMMA4_PRES)
