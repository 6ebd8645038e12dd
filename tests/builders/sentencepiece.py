"""A llama-architecture pair with a SentencePiece vocabulary, as Mistral, Llama 2 and Gemma have.

Unlike the byte-level BPE of the other synthetic models, SentencePiece marks spaces with "▁",
adds one before the text, and spells a character outside its vocabulary with byte-fallback
tokens (<0xE4> <0xB8> <0xAD> for 中): one character, several tokens, none of them text alone.
The target answers "[/INST]" with ANSWER, whose ï, 中, 文 and 🙂 only byte tokens can spell, so
tests see those characters streamed whole. The draft is the target's first layer.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np

from ollama_spec.synthetic.layout import write_model
from ollama_spec.synthetic.models import FILE_TYPES, Architecture, WeightRecipe, make_weights, new_llama_writer
from tests.builders.writers import write_first_layers

NORMAL, UNKNOWN, CONTROL, BYTE = 1, 2, 3, 6  # llama.cpp's token types
SPACE = "\u2581"
CORPUS = (
    "The quick brown fox jumps over the lazy dog. Speculative decoding lets a small draft model "
    "propose several tokens that the large target model then checks in a single pass. Hello world, "
    "once upon a time there was a little robot who wanted to paint the sea. Le café est très bon."
)
BYTES_ONLY = set("ïüñ中文日本語🙂😀€")  # kept out of the vocabulary
ANSWER = "Hello naïve中文,🙂."
MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] in ('user', 'system') %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}"
    "{% endif %}{% endfor %}"
)
ARCH = Architecture(n_embd=64, n_layer=4, n_head=4, n_kv_head=2, n_ff=128, context_length=4096)


def spm_vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and types: <unk> <s> </s> [INST] [/INST], the 256 bytes, then pieces of CORPUS."""
    tokens = ["<unk>", "<s>", "</s>", "[INST]", "[/INST]"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN] + [CONTROL] * 4 + [BYTE] * 256
    chars = sorted({c for c in CORPUS + "0123456789!?,.;:'\"()-" if c not in BYTES_ONLY | {" "}})
    pieces = [SPACE, *chars]
    for word in dict.fromkeys(re.findall(r"[A-Za-zéèà]+", CORPUS)):
        marked = SPACE + word
        pieces += [marked[:n] for n in range(2, len(marked) + 1)] + [word[:n] for n in range(2, min(4, len(word)) + 1)]
    pieces = list(dict.fromkeys(pieces))
    scores = [0.0] * len(tokens) + [-float(i) if len(p) == 1 else len(p) - i / 1000 for i, p in enumerate(pieces)]
    return tokens + pieces, scores, types + [NORMAL] * len(pieces)


def write_spm_gguf(
    path: Path,
    *,
    name: str,
    n_layer: int,
    vocab: tuple[list[str], list[float], list[int]],
    weights: dict[str, np.ndarray],
) -> Path:
    tokens, scores, types = vocab
    writer = new_llama_writer(path, name, ARCH, n_layer, FILE_TYPES["F32"])
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(True)
    writer.add_chat_template(MISTRAL_TEMPLATE)
    write_first_layers(writer, weights, n_layer)
    return path


def build_spm_pair(root: Path, answer_tokens: list[int]) -> tuple[str, str]:
    """spm-target and spm-draft in the store at `root`. `answer_tokens`: ANSWER as this vocabulary
    spells it (llama.cpp's tokenizer decides; tests read it with a vocabulary-only load), which
    the target learns to say after [/INST], then </s>."""
    vocab = spm_vocabulary()
    chain = [vocab[0].index("[/INST]"), *answer_tokens, vocab[0].index("</s>")]
    raw_bytes = [5 + b for b in range(256) if not 0x20 <= b < 0x7F and 5 + b not in chain]
    weights = make_weights(
        ARCH, len(vocab[0]), WeightRecipe(seed=3, residual_scale=0.12, quiet_tokens=tuple(raw_bytes)), draft_layers=1
    )
    embeddings, output = weights["token_embd.weight"], weights["output.weight"]
    for token in set(chain[:-1]):
        embeddings[token] *= 3.0
    for token, following in itertools.pairwise(chain):  # each chain token's output row points at the next
        row = embeddings[token].astype(np.float32)
        output[following] = row * (6.0 / np.linalg.norm(row))
    for name, n_layer in (("spm-target", ARCH.n_layer), ("spm-draft", 1)):
        path = write_spm_gguf(root.parent / f"{name}.gguf", name=name, n_layer=n_layer, vocab=vocab, weights=weights)
        write_model(root, name, path, params={"stop": ["[INST]", "[/INST]"]}, template=None)
    return "spm-target", "spm-draft"


def vocabulary_only(path: Path) -> Path:
    """A file with the vocabulary and no layers, for llama.cpp to tokenize ANSWER before the pair exists."""
    vocab = spm_vocabulary()
    weights = make_weights(ARCH, len(vocab[0]), WeightRecipe(seed=1), draft_layers=1)
    return write_spm_gguf(path, name="spm-vocab", n_layer=1, vocab=vocab, weights=weights)
