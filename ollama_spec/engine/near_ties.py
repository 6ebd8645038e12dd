"""Why a greedy speculative output parts from the target alone's: a floating-point near-tie, a
verify batch's rounding, or a real verification error. Diagnostics, run after a mismatch."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ollama_spec.decoding.loop import DEFAULT_MAX_SPECULATIVE_TOKENS
from ollama_spec.decoding.penalties import adjusted
from ollama_spec.decoding.proposers import common_prefix, keep_common_prefix
from ollama_spec.engine.requests import Request
from ollama_spec.llama.grammar import Grammar
from ollama_spec.llama.model import LoadedModel

# Greedy outputs that part where the target's two best logits are closer than this are
# floating-point near-ties: a batch of K+1 and a single token round differently.
NEAR_TIE_LOGITS = 0.02


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Where two token lists first differ (the shorter one's length when one extends the other); None when equal."""
    return None if list(a) == list(b) else common_prefix(a, b)


def greedy_margins(
    target: LoadedModel, prompt: list[int], tokens: list[int], chunk: int = 64, request: Request | None = None
) -> list[float]:
    """The target's top-1 minus top-2 logit at each position of `tokens` after `prompt`, as the
    `request` chose among them (its penalties and output grammar applied).

    Tells a floating-point near-tie (batched and single-token evaluation may round a
    0.001-logit gap either way) from a real divergence when greedy outputs differ.
    """
    target.truncate(0)
    if len(prompt) > 1:
        target.eval(prompt[:-1])
    inputs = [prompt[-1], *tokens[:-1]]
    margins: list[float] = []
    with _RowsAsChosen(target, request, prompt) as chosen:
        for start in range(0, len(inputs), chunk):  # chunks bound the logits held at once
            for row, token in zip(
                target.eval(inputs[start : start + chunk], logits="all"), tokens[start : start + chunk]
            ):
                top2 = np.sort(chosen.row(row))[-2:]  # under a grammar, one allowed token is no tie: inf
                margins.append(float(top2[1] - top2[0]) if np.isfinite(top2).all() else float("inf"))
                chosen.advance(token)
    return margins


def chosen_in_a_batch(
    target: LoadedModel,
    prompt: list[int],
    tokens: list[int],
    at: int,
    token: int,
    max_batch: int = DEFAULT_MAX_SPECULATIVE_TOKENS + 1,
    request: Request | None = None,
) -> int | None:
    """The size of a batch in which the target itself picks `token` for `tokens[at]`, or None.

    llama.cpp's kernels for one token and for a batch round differently (tiled matrix products,
    quantized blocks), by up to tenths of a logit after many layers. When a greedy speculative
    output parts from the target alone's, this tells that rounding, which the verify batch
    makes, from a verification error: it evaluates the position in every batch of 2..max_batch
    tokens and every place in it, as verify batches hold it (the `request`'s penalties and
    output grammar applied, as the loop applies them).
    """
    seq = [*prompt, *tokens]
    position = len(prompt) - 1 + at  # the input whose logits choose tokens[at]
    with _RowsAsChosen(target, request, prompt) as chosen:
        for earlier in tokens[:at]:
            chosen.advance(earlier)
        keep_common_prefix(target, seq)
        for size in range(2, max_batch + 1):
            for row in range(size):
                start = position - row
                if start < 0 or start + size > len(seq):
                    continue
                target.truncate(min(target.n_past, start))
                if target.n_past < start:
                    target.eval(seq[target.n_past : start])
                picked = int(np.argmax(chosen.row(target.eval(seq[start : start + size], logits="all")[row])))
                target.truncate(start)
                if picked == token:
                    return size
    return None


def chosen_as_batched(
    target: LoadedModel,
    prompt: list[int],
    tokens: list[int],
    batches: Sequence[tuple[int, int]],
    at: int,
    token: int,
    request: Request | None = None,
) -> bool:
    """Does the target itself pick `token` for `tokens[at]` when its cache is built in `batches`, a
    speculative run's own target batches in order (SpeculationStats.batches: first position, size)?

    chosen_in_a_batch tries the position in every batch, but on a cache built in other batches:
    the cells a run verified in batches round apart from those it read one at a time, and after
    ~190 tokens of a Q4_0 target that tipped a 0.026-logit margin. Each batch is evaluated as the
    loop evaluated it, with the rows it asked for (the first, which read the prompt, only its last);
    the drafts it rejected stand in as the text's own tokens (a row's rounding depends on the
    batch's size, not on the other rows' tokens). Cells the run found cached are read in one batch.
    """
    seq = [*prompt, *tokens]
    position = len(prompt) - 1 + at  # the input whose logits choose tokens[at]
    with _RowsAsChosen(target, request, prompt) as chosen:
        for earlier in tokens[:at]:
            chosen.advance(earlier)
        target.truncate(0)
        for index, (start, size) in enumerate(batches):
            if start > position:
                break
            target.truncate(start)
            if target.n_past < start:
                target.eval(seq[target.n_past : start])
            batch = seq[start : start + size]
            batch += [batch[-1]] * (size - len(batch))  # drafts past the end of the text as compared
            rows = target.eval(batch, logits="last" if index == 0 else "all")
            if start <= position < start + size:
                row = rows[-1] if index == 0 else rows[position - start]
                return int(np.argmax(chosen.row(row))) == token
    return False


class _RowsAsChosen:
    """A greedy request's rows as its loop chose from them: penalized by the text before each row and
    masked by its output grammar after it (`advance` moves past each emitted token). Without a
    request, rows as they are."""

    def __init__(self, target: LoadedModel, request: Request | None, prompt: list[int]):
        self.text = list(prompt)
        self.penalties = request.sampling.penalties if request is not None else None
        self.grammar = Grammar.for_model(target, request.grammar) if request is not None and request.grammar else None

    def row(self, logits: np.ndarray) -> np.ndarray:
        if self.penalties is not None and self.penalties.active:
            logits = adjusted(logits, self.penalties.window(self.text), self.penalties)
        return self.grammar.mask(logits) if self.grammar is not None else logits

    def advance(self, token: int) -> None:
        self.text.append(token)
        if self.grammar is not None and self.grammar.allows(token):
            self.grammar.accept(token)

    def __enter__(self) -> _RowsAsChosen:
        return self

    def __exit__(self, *exc) -> None:
        if self.grammar is not None:
            self.grammar.close()
