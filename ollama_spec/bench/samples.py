"""Timed generations, the rows they make up, and the statistics a row reports."""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import psutil

from ollama_spec.decoding.step_costs import estimate_alpha
from ollama_spec.engine.near_ties import NEAR_TIE_LOGITS, first_difference
from ollama_spec.prompting.text_stream import Run

BASELINE = "baseline"
LOCAL_BASELINE = "baseline without RPC"  # beside --rpc rows: the target on this machine only
LLAMA_CPP_BASELINE = "llama-cpp-python target alone"  # the reference rows' own baseline
SPECULATIVE = "speculative"
SPECULATIVE_AUTO = "speculative, K chosen each step"
LOOKUP = "n-gram lookup"  # ours: draftless, through the same loop and verifier
DRAFT_AND_LOOKUP = "draft model and n-gram lookup"  # ours: --ngram beside the draft, K=auto
LLAMA_CPP_DRAFT = "llama-cpp-python draft_model"
PROMPT_LOOKUP = "prompt lookup"
# llama-cpp-python's own rows: how its Llama evaluates (its batches, its rounding) is not ours to vouch for
REFERENCES = (LLAMA_CPP_BASELINE, LLAMA_CPP_DRAFT, PROMPT_LOOKUP)
NATIVE = "llama.cpp speculative-simple"  # llama.cpp's own C++ loop, timed only
# Ours again, timed interleaved with the reference rows in their phase (see bench.runner.beside_rows)
BESIDE_BASELINE = "target alone, beside the references"
BESIDE_SPECULATIVE = "speculative, beside the references"
BESIDE_AUTO = "speculative K=auto, beside the references"


@dataclass
class Sample:
    """One generation of one prompt."""

    prompt: str
    run: int
    tokens: list[int]
    first_token_s: float
    total_s: float
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    rejections: int = 0
    k_chosen: dict[int, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)  # "draft", "ngram": who proposed them
    draft_s: float = 0.0
    verify_s: float = 0.0
    llama_s: float = 0.0  # inside llama.cpp (decode and logits copies), both models
    runs: tuple[Run, ...] = ()  # the text by who wrote it, kept for one sample per speculative row (sample.html)
    batches: list[tuple[int, int]] = field(default_factory=list)  # the target's, to replay a greedy difference

    @property
    def decode_s(self) -> float:
        # tok/s leaves out the first token, which waits for the prompt (TTFT is reported apart)
        return self.total_s - self.first_token_s


@dataclass
class Row:
    label: str
    kind: str
    k: int | None = None
    samples: list[Sample] = field(default_factory=list)
    peak_rss: int = 0
    predicted_speedup: float | None = None
    mismatches: list[str] = field(default_factory=list)
    near_ties: list[str] = field(default_factory=list)  # differences explained by rounding, see NEAR_TIE_LOGITS

    @property
    def is_reference(self) -> bool:
        """One of llama-cpp-python's own rows, timed for comparison."""
        return self.kind in REFERENCES

    @property
    def is_baseline(self) -> bool:
        """The target alone (no drafting), on its own or, beside --rpc rows, on this machine only."""
        return self.kind in (BASELINE, LOCAL_BASELINE, LLAMA_CPP_BASELINE, BESIDE_BASELINE)

    def run_rates(self) -> list[float]:
        """tok/s of each run over all its prompts: generated tokens after the first / decode time."""
        rates = []
        for run in sorted({s.run for s in self.samples}):
            chosen = [s for s in self.samples if s.run == run]
            decode = sum(s.decode_s for s in chosen)
            rates.append(sum(len(s.tokens) - 1 for s in chosen) / decode if decode > 0 else 0.0)
        return rates

    @property
    def tokens_per_second(self) -> float:
        return statistics.median(self.run_rates()) if self.samples else 0.0

    @property
    def ttft_s(self) -> float:
        return statistics.median(s.first_token_s for s in self.samples) if self.samples else 0.0

    @property
    def drafted(self) -> int:
        return sum(s.drafted for s in self.samples)

    @property
    def accepted(self) -> int:
        return sum(s.accepted for s in self.samples)

    @property
    def steps(self) -> int:
        return sum(s.steps for s in self.samples)

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def k_chosen(self) -> dict[int, int]:
        """Steps per K, over every sample (K=auto chooses anew each step)."""
        return _summed(sample.k_chosen for sample in self.samples)

    @property
    def accepted_by_source(self) -> dict[str, int]:
        return _summed(sample.accepted_by_source for sample in self.samples)

    @property
    def alpha(self) -> float | None:
        """The probability that a tried draft is accepted: what the cost model's α means."""
        return estimate_alpha(self.accepted, sum(s.rejections for s in self.samples))

    @property
    def tokens_per_step(self) -> float | None:
        """Accepted drafts plus the target's own token, per target pass."""
        return (self.accepted + self.steps) / self.steps if self.steps and not self.is_baseline else None

    @property
    def overhead_per_step_s(self) -> float | None:
        """Time per target pass spent outside llama.cpp: the loop's own cost."""
        steps = sum(s.steps for s in self.samples) if not self.is_baseline else sum(len(s.tokens) for s in self.samples)
        outside = sum(s.total_s - s.llama_s for s in self.samples)
        return outside / steps if steps and any(s.llama_s for s in self.samples) else None

    @property
    def draft_share(self) -> float | None:
        """Fractions of generation time spent drafting and verifying."""
        total = sum(s.total_s for s in self.samples)
        return sum(s.draft_s for s in self.samples) / total if total and not self.is_baseline else None

    @property
    def verify_share(self) -> float | None:
        total = sum(s.total_s for s in self.samples)
        return sum(s.verify_s for s in self.samples) / total if total and not self.is_baseline else None


class PeakMemory:
    """Samples this process's resident memory in a thread; `take()` gives the peak since the last take."""

    def __init__(self, interval_s: float = 0.02):
        self._process = psutil.Process()
        self._interval = interval_s
        self._peak = self._process.memory_info().rss
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _watch(self) -> None:
        while not self._stop.wait(self._interval):
            self._note()

    def _note(self) -> None:
        rss = self._process.memory_info().rss
        with self._lock:
            self._peak = max(self._peak, rss)

    def take(self) -> int:
        self._note()  # a run shorter than the interval still counts
        with self._lock:
            peak, self._peak = self._peak, self._process.memory_info().rss
        return peak


def compare_tokens(
    row: Row,
    expected: dict[str, list[int]],
    margins: dict[str, list[float]] | None = None,
    batch_choice: Callable[[str, int, int, Sequence[tuple[int, int]]], str | None] | None = None,
) -> None:
    """Greedy runs: record every sample whose tokens differ from the target alone's.

    A difference that rounding explains is recorded apart, as not a verification error: at a
    near-tie of the target's top-1 minus top-2 logits, or where `batch_choice(prompt, at, token,
    batches)` finds that the target itself picks the token in a verify batch, or on a cache built
    in the sample's own batches (runner.BatchChoice: it says which).
    """
    for sample in row.samples:
        want = expected.get(sample.prompt)
        if want is None or sample.tokens == want:
            continue
        at = first_difference(sample.tokens, want)
        message = (
            f"{row.label}: prompt '{sample.prompt}' run {sample.run + 1} differs from the "
            f"target alone at token {at} of {len(want)}"
        )
        margin = (margins or {}).get(sample.prompt, [])[at : at + 1]
        if margin and margin[0] < NEAR_TIE_LOGITS:
            row.near_ties.append(f"{message}, where the target's two best logits are {margin[0]:.4f} apart (near-tie)")
            continue
        picked = (
            batch_choice(sample.prompt, at, sample.tokens[at], sample.batches)
            if batch_choice and at < len(sample.tokens)
            else None
        )
        if picked is not None:
            row.near_ties.append(
                f"{message}, where {picked} (batch rounding{f'; logit margin {margin[0]:.3f}' if margin else ''})"
            )
        else:
            row.mismatches.append(message + (f" (logit margin {margin[0]:.3f})" if margin else ""))


def _summed(counts: Iterable[dict]) -> dict:
    """Counts by key, added up over several dicts of them."""
    total: dict = {}
    for each in counts:
        for key, n in each.items():
            total[key] = total.get(key, 0) + n
    return total
