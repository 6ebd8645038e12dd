"""Text to tokens in pieces, so that a long prompt full of special tokens costs time in proportion to its length.

llama.cpp splits text at special tokens (`<|im_start|>`, ...) before it tokenizes the pieces, and walks its
list of pieces from the start for every special token it finds: a prompt with n special tokens costs about
n² steps (on the synthetic Llama 3 pair, a chat of 10,000 messages, 700 KB, took 4.6 s of CPU; 20,000, about
18 s). Cut at special tokens into pieces of about CHUNK_BYTES, each tokenized alone, the 10,000 messages
take 0.1 s.

A cut is made only where llama.cpp would split the text anyway: right before a special token's text, which
no other special token's text overlaps, and not after whitespace that the token would strip (an LSTRIP
token). Each piece is then tokenized as llama.cpp tokenizes the text between two special tokens (a
SentencePiece vocabulary adds its space prefix after a special token either way), so the tokens are the
same as the whole text's. Only the first piece gets the BOS; a vocabulary that also adds an EOS is never cut.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from dataclasses import dataclass

import llama_cpp

CHUNK_BYTES = 8 * 1024
CANDIDATES = 256  # special-token starts looked at for one cut before the piece is simply left longer
_SPECIAL = (
    llama_cpp.LLAMA_TOKEN_ATTR_CONTROL | llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED | llama_cpp.LLAMA_TOKEN_ATTR_UNKNOWN
)
_SPACE = frozenset(b" \t\n\v\f\r")  # C's isspace, which llama.cpp's LSTRIP uses


@dataclass(frozen=True)
class SpecialTexts:
    """The texts llama.cpp matches as special tokens before tokenizing, and which of them strip the
    whitespace before them."""

    texts: frozenset[bytes]
    lstrip: frozenset[bytes]
    lengths: tuple[int, ...]
    starts: re.Pattern[bytes] | None  # a byte that begins some special text

    @classmethod
    def of(cls, vocab) -> SpecialTexts:
        """Read from a loaded vocabulary (once per model: it walks every token's attributes)."""
        texts, lstrip = set(), set()
        for token in range(llama_cpp.llama_vocab_n_tokens(vocab)):
            attr = llama_cpp.llama_vocab_get_attr(vocab, token)
            if not attr & _SPECIAL:
                continue
            text = llama_cpp.llama_vocab_get_text(vocab, token) or b""
            if text:
                texts.add(text)
                if attr & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP:
                    lstrip.add(text)
        first = {text[0] for text in texts}
        starts = re.compile(b"[" + b"".join(re.escape(bytes([b])) for b in sorted(first)) + b"]") if first else None
        return cls(frozenset(texts), frozenset(lstrip), tuple(sorted({len(t) for t in texts})), starts)

    def at(self, data: bytes, q: int) -> list[bytes]:
        """The special texts that begin at byte `q`."""
        return [data[q : q + n] for n in self.lengths if data[q : q + n] in self.texts]

    def covered(self, data: bytes, q: int) -> bool:
        """Whether a special text begins before `q` and ends after it."""
        longest = self.lengths[-1]
        for start in range(max(0, q - longest + 1), q):
            if any(start + len(text) > q for text in self.at(data, start)):
                return True
        return False


def cuts(data: bytes, special: SpecialTexts, chunk: int = CHUNK_BYTES) -> list[int]:
    """Byte offsets where `data` may be cut (see the module's docstring), about `chunk` bytes apart."""
    if special.starts is None:
        return []
    found, at = [], chunk
    while at < len(data):
        cut, looked, last = None, 0, at
        for match in special.starts.finditer(data, at):
            last, looked = match.start(), looked + 1
            if looked > CANDIDATES:
                break
            texts = special.at(data, last)
            if not texts or special.covered(data, last):
                continue
            if data[last - 1] in _SPACE and any(text in special.lstrip for text in texts):
                continue
            cut = last
            break
        if cut is None:
            if looked <= CANDIDATES:  # no place to cut after `at`: the rest is one piece
                break
            at = last + 1
            continue
        found.append(cut)
        at = cut + chunk
    return found


def tokenize_in_pieces(
    data: bytes,
    tokenize: Callable[[bytes, bool, bool], list[int]],
    special: SpecialTexts,
    *,
    add_bos: bool,
    adds_eos: bool,
) -> list[int]:
    """`tokenize(data, add_bos, True)` (llama.cpp's, special tokens parsed), done piece by piece when it is long."""
    if len(data) <= CHUNK_BYTES or adds_eos and add_bos:
        return tokenize(data, add_bos, True)
    bounds = [0, *cuts(data, special), len(data)]
    tokens: list[int] = []
    for i, (start, end) in enumerate(itertools.pairwise(bounds)):
        tokens += tokenize(data[start:end], add_bos and i == 0, True)
    return tokens


class Tokenizer:
    """One loaded model's text to tokens: llama.cpp's, a long text with special tokens in pieces."""

    def __init__(self, model):
        self.model = model  # llama_cpp's LlamaModel
        self._special: SpecialTexts | None = None  # read on the first long text

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        data = text.encode("utf-8")
        if not special or len(data) <= CHUNK_BYTES:
            return self.model.tokenize(data, add_bos, special)
        if self._special is None:
            self._special = SpecialTexts.of(self.model.vocab)
        adds_eos = bool(llama_cpp.llama_vocab_get_add_eos(self.model.vocab))
        return tokenize_in_pieces(data, self.model.tokenize, self._special, add_bos=add_bos, adds_eos=adds_eos)
