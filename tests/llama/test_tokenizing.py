"""Long texts tokenized in pieces (llama/tokenizing.py) give exactly the tokens llama.cpp gives the whole text,
for a SentencePiece vocabulary (its space prefix after a special token) and SmolLM2's BPE one (49 special
tokens), on texts built to catch a bad cut: special tokens touching, after spaces and newlines, inside words."""

from __future__ import annotations

import random

import llama_cpp
import pytest

from ollama_spec.llama.tokenizing import CHUNK_BYTES, SpecialTexts, cuts, tokenize_in_pieces
from tests.builders.sentencepiece import vocabulary_only
from tests.smollm2 import smollm2_gguf

WORDS = ["hello", "naïve", "中文", "🙂", " ", "  ", "\n", "\n\n", "\t", "a", "<", ">", "|", "<|", "x<|", "end"]


@pytest.fixture(scope="module", params=["sentencepiece", "smollm2"])
def vocab(request, tmp_path_factory):
    if request.param == "sentencepiece":
        path = vocabulary_only(tmp_path_factory.mktemp("spm") / "vocab.gguf")
    else:
        path = smollm2_gguf()
    model = llama_cpp.Llama(str(path), vocab_only=True, verbose=False)
    yield model._model
    model.close()


def texts(special: SpecialTexts, seed: int) -> str:
    """About 2 pieces' worth of words and special tokens, in random order."""
    rng = random.Random(seed)
    marks = sorted(text.decode("utf-8", "replace") for text in special.texts)
    parts, size = [], 0
    while size < 2 * CHUNK_BYTES + 1000:
        part = rng.choice(marks) if rng.random() < 0.1 else rng.choice(WORDS)
        parts.append(part)
        size += len(part.encode())
    return "".join(parts)


@pytest.mark.parametrize("seed", range(4))
def test_pieces_give_the_whole_texts_tokens(vocab, seed):
    special = SpecialTexts.of(vocab.vocab)
    assert special.texts
    data = texts(special, seed).encode()
    assert cuts(data, special), "the text was not cut: the test would show nothing"
    for add_bos in (True, False):
        whole = vocab.tokenize(data, add_bos, True)
        pieces = tokenize_in_pieces(data, vocab.tokenize, special, add_bos=add_bos, adds_eos=False)
        assert pieces == whole


def test_a_chat_of_many_turns_is_cut_where_llama_cpp_splits_it(vocab):
    special = SpecialTexts.of(vocab.vocab)
    marks = sorted(text.decode() for text in special.texts)
    turn = f"{marks[0]}user\nmessage {{}} hello  {marks[-1]}\n"
    data = "".join(turn.format(i) for i in range(2500)).encode()
    found = cuts(data, special)
    assert len(found) >= len(data) // CHUNK_BYTES - 1
    assert all(any(data.startswith(text, q) for text in special.texts) for q in found)
    assert tokenize_in_pieces(data, vocab.tokenize, special, add_bos=True, adds_eos=False) == vocab.tokenize(
        data, True, True
    )
