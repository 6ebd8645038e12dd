"""The loop's side of structured output, with no llama.cpp: masked_rows over any TokenGrammar, and
decoding/ importing where llama-cpp-python cannot be."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import numpy as np

import ollama_spec.decoding
from ollama_spec.decoding.grammar import TokenGrammar, masked_rows


class Alternating:
    """Even and odd token ids by turns, starting with an even one (a TokenGrammar over any vocabulary)."""

    def __init__(self, parity: int = 0):
        self.parity, self.copies, self.closed = parity, [], False

    def copy(self) -> Alternating:
        twin = Alternating(self.parity)
        self.copies.append(twin)
        return twin

    def allows(self, token: int) -> bool:
        return token % 2 == self.parity

    def mask(self, logits: np.ndarray) -> np.ndarray:
        masked = logits.copy()
        masked[1 - self.parity :: 2] = -np.inf
        return masked

    def best(self, logits: np.ndarray) -> int | None:
        return int(self.mask(logits).argmax())

    def accept(self, token: int) -> None:
        assert self.allows(token)
        self.parity = 1 - self.parity

    def close(self) -> None:
        self.closed = True


def test_masked_rows_follow_the_drafted_tokens_on_a_copy():
    grammar: TokenGrammar = Alternating()
    logits = np.zeros((4, 6), dtype=np.float32)
    logits[:, 3] = 9.0  # odd: allowed only after an even token
    rows = masked_rows(grammar, [2, 3, 5], logits, greedy=False)
    assert np.isneginf(rows[0, 3]) and rows[1, 3] == 9.0 and np.isneginf(rows[2, 3])
    assert (rows[3] == logits[3]).all()  # 5 is forbidden after 3: row 3 is never read, left as it was
    assert grammar.parity == 0 and grammar.copies[0].closed  # the grammar itself did not move


def test_greedy_rows_whose_best_token_is_allowed_are_not_masked():
    logits = np.zeros((2, 6), dtype=np.float32)
    logits[0, 4] = 9.0  # allowed first: row 0 stays as it is
    logits[1, 4] = 9.0  # after 4 an odd token: row 1 is masked
    rows = masked_rows(Alternating(), [4], logits, greedy=True)
    assert (rows[0] == logits[0]).all() and np.isneginf(rows[1, 4])


def test_decoding_imports_without_llama_cpp():
    modules = [f"ollama_spec.decoding.{m.name}" for m in pkgutil.iter_modules(ollama_spec.decoding.__path__)]
    assert "ollama_spec.decoding.loop" in modules and "ollama_spec.decoding.grammar" in modules
    code = (
        "import importlib, sys\n"
        "sys.modules['llama_cpp'] = None  # `import llama_cpp` now raises ImportError\n"
        f"for name in {modules!r}:\n"
        "    importlib.import_module(name)\n"
        "assert not any(m == 'llama_cpp' or m.startswith('llama_cpp.') for m in sys.modules if sys.modules[m])\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
