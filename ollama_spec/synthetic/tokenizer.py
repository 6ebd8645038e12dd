"""A small byte-level BPE vocabulary in Llama 3's layout, learned from a built-in corpus."""

from __future__ import annotations

import itertools
import random
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache

# Normal and control token types, as in gguf.TokenType.
NORMAL, CONTROL = 1, 3
BOS, EOS, START_HEADER, END_HEADER, EOT = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
)
SPECIAL_TOKENS = (BOS, EOS, START_HEADER, END_HEADER, EOT)

CORPUS = """
The quick brown fox jumps over the lazy dog. Speculative decoding lets a small draft model
propose several tokens that the large target model then checks in a single forward pass.
When the draft is right, many tokens are accepted at the cost of one step of the target.
The output is exactly what the target would have written alone. A model that runs on a local
GPU reads all of its weights from memory for every token, so checking five tokens at once costs
about as much as generating one. Explain the difference between a process and a thread.
Write a function that returns the sum of the squares of a list of numbers.
def sum_of_squares(numbers):
    return sum(n * n for n in numbers)
for i in range(10):
    print(i, i * i)
class Model:
    def __init__(self, name, size):
        self.name = name
        self.size = size
Translate to French: the weather is nice today and we are going to the park.
Le temps est beau aujourd'hui et nous allons au parc.
What is the capital of France? The capital of France is Paris, a city on the river Seine.
Once upon a time there was a little robot who wanted to learn how to paint the sea.
Jelaskan arsitektur microservices vs monolith dan kapan harus migrasi.
Anda pakar arsitektur perangkat lunak. Sebuah aplikasi monolith lebih mudah dibangun,
tetapi microservices lebih mudah diskalakan ketika tim dan sistem tumbuh besar.
In computer science, a cache is a component that stores data so that future requests for that
data can be served faster; the data stored in a cache might be the result of an earlier
computation or a copy of data stored elsewhere. Memory bandwidth, latency and throughput are
the numbers that matter. The user asked the assistant a question, and the assistant answered.
"""

# Close to Llama 3's pre-tokenizer split: words with a leading space, numbers, punctuation, spaces.
_WORDS = re.compile(r"'(?:s|t|re|ve|m|ll|d)| ?[A-Za-z]+| ?[0-9]{1,3}| ?[^\sA-Za-z0-9]+|\s+")


@lru_cache(maxsize=1)
def byte_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map, used by every byte-level BPE."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {b: chr(c) for b, c in zip(printable, chars)}


@dataclass(frozen=True)
class Vocabulary:
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    merges: tuple[str, ...]

    @property
    def size(self) -> int:
        return len(self.tokens)

    def id_of(self, token: str) -> int:
        return self.tokens.index(token)


def build_vocabulary(size: int, n_merges: int) -> Vocabulary:
    """256 byte tokens, up to `n_merges` learned merges, the special tokens, reserved padding."""
    mapping = byte_to_unicode()
    tokens = [mapping[b] for b in range(256)]
    merges = list(_learn_merges(n_merges))
    seen = set(tokens)
    for merge in merges:
        merged = merge.replace(" ", "")
        if merged not in seen:
            seen.add(merged)
            tokens.append(merged)
    if len(tokens) + len(SPECIAL_TOKENS) > size:
        raise ValueError(f"vocabulary needs {len(tokens) + len(SPECIAL_TOKENS)} tokens but size is {size}")
    _add_filler_merges(tokens, merges, size - len(SPECIAL_TOKENS))
    types = [NORMAL] * len(tokens)
    tokens += SPECIAL_TOKENS
    types += [CONTROL] * len(SPECIAL_TOKENS)
    return Vocabulary(tuple(tokens), tuple(types), tuple(merges))


def _add_filler_merges(tokens: list[str], merges: list[str], size: int) -> None:
    """Grow a small corpus's vocabulary to `size` with word + suffix merges (all real BPE)."""
    rng = random.Random(size)
    starts = [t for t in tokens[256:] if t.startswith("Ġ")]
    suffixes = [t for t in tokens[256:] if not t.startswith("Ġ") and len(t) > 1]
    seen = set(tokens)
    misses = 0
    while len(tokens) < size:
        left, right = rng.choice(starts), rng.choice(suffixes)
        if left + right not in seen:
            seen.add(left + right)
            tokens.append(left + right)
            merges.append(f"{left} {right}")
            misses = 0
        elif (misses := misses + 1) > 1000:  # pairs used up: longer words make new ones
            starts = [t for t in tokens[256:] if t.startswith("Ġ")]


@lru_cache(maxsize=8)
def _learn_merges(n_merges: int) -> tuple[str, ...]:
    """Plain BPE training: repeatedly merge the most frequent adjacent pair (ties by text)."""
    mapping = byte_to_unicode()
    words = Counter(tuple(mapping[b] for b in word.encode("utf-8")) for word in _WORDS.findall(CORPUS))
    merges: list[str] = []
    while len(merges) < n_merges:
        pairs: Counter = Counter()
        for word, count in words.items():
            for pair in itertools.pairwise(word):
                pairs[pair] += count
        if not pairs:
            break
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(f"{best[0]} {best[1]}")
        words = Counter({_apply_merge(word, best): count for word, count in words.items()})
    return tuple(merges)


def _apply_merge(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out, i = [], 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)
