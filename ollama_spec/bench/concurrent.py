"""`bench --concurrency N` in process: N clients at once on the engine's slots, no HTTP, and the ceiling.

Each client is a thread that runs the prompt set in turn (client i starting at prompt i), every
request in a slot of the engine's step loop beside the others, as `serve --parallel` runs them; the rate is all clients' tokens over the wall time. Rows (-k auto and fixed Ks) and
client counts are interleaved round by round, each round's rows in a turned order, so the machine's drift
falls on all of them alike.

The ceiling is what an ideal schedule would make of the same passes: every batch the engine ran is
timed (StepLoop.passes) and fitted as a line per model (seconds = a + c·tokens, from the passes
without padding), the acceptance
by position is each prompt's as the longest fixed K measured it (greedy: the draft's guesses do not
depend on K), and each step gives every slot its best K for the whole batch, with no time outside
llama.cpp. Each request is priced whole, as any schedule must run it: `max_tokens` tokens, its last
step's drafts cut at the answer's end (a step that has two tokens left drafts one at most), so a slot
makes max_tokens ÷ its expected steps a step, not its steady step's expected tokens (at 64 tokens on the
demo pair that is 3-5 % less). Ours (and a server's) as a fraction of it says how near the machine's
limit we are.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ollama_spec.bench.prompts import Prompt
from ollama_spec.bench.settings import BenchSettings
from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.engine.sinks import stream
from ollama_spec.engine.step_loop import Pass

WARMUP_TOKENS = 16


@dataclass(frozen=True)
class Line:
    """Seconds of a pass as a + c·n (n: tokens, or sequences for the draft's proposals)."""

    fixed_s: float
    per_s: float

    def __call__(self, n: float) -> float:
        return self.fixed_s + self.per_s * n

    @classmethod
    def fit(cls, points: Sequence[tuple[int, float]]) -> Line | None:
        """The line through each size's median (a pass the machine paused in is one of many of its
        size), each size weighed by how many passes it had."""
        by_size: dict[int, list[float]] = {}
        for n, seconds in points:
            by_size.setdefault(n, []).append(seconds)
        if not by_size:
            return None
        sizes = np.array(sorted(by_size), dtype=float)
        medians = np.array([statistics.median(by_size[int(n)]) for n in sizes])
        if len(sizes) < 2:  # one size only: no slope to tell, all of it fixed
            return cls(float(medians[0]), 0.0)
        weights = np.sqrt([len(by_size[int(n)]) for n in sizes])
        slope, intercept = np.polyfit(sizes, medians, 1, w=weights)
        return cls(max(float(intercept), 0.0), max(float(slope), 0.0))


@dataclass
class Cell:
    """One row at one client count: its rate in each round, and what its runs drafted and accepted."""

    rates: list[float] = field(default_factory=list)
    # by prompt name: steps that drafted each position, and that accepted it (fixed K: survival)
    drafted: dict[str, list[int]] = field(default_factory=dict)
    accepted: dict[str, list[int]] = field(default_factory=dict)
    steps: int = 0  # the step loop's steps in its runs, and their seconds outside llama.cpp's passes
    outside_s: float = 0.0

    @property
    def median(self) -> float:
        return statistics.median(self.rates)

    @property
    def python(self) -> str:
        """The Python time a step, outside llama.cpp's passes."""
        return f"{self.outside_s / self.steps * 1e3:.2f} ms" if self.steps else "-"


@dataclass
class ConcurrentReport:
    model: str
    slots: int
    max_tokens: int
    rows: list[int | None]  # None: auto
    clients: list[int]
    cells: dict[tuple[int, int | None], Cell] = field(default_factory=dict)
    passes: dict[int, list[Pass]] = field(default_factory=dict)  # by client count
    mismatches: list[str] = field(default_factory=list)  # greedy texts that differ between rows
    # by client count: the step loop's steps and their seconds outside llama.cpp's passes
    outside: dict[int, tuple[int, float]] = field(default_factory=dict)
    target_index: int = 0  # step_loop.Pass.model: 0 the target, 1 the draft

    def lines(self, clients: int) -> tuple[Line | None, Line | None]:
        """The target's verify passes and the draft's proposals at this client count, as lines."""
        passes = self.passes.get(clients, [])
        # verify passes (every row read: no prompt) whose sequences brought as many tokens each (no padding)
        target = [
            (p.tokens, p.seconds)
            for p in passes
            if p.model == self.target_index and p.rows == p.tokens == p.widest * p.sequences
        ]
        draft = [(p.sequences, p.seconds) for p in passes if p.model != self.target_index and p.tokens == p.sequences]
        return Line.fit(target), Line.fit(draft)

    def survival(self) -> dict[str, list[float]]:
        """Each prompt's chance that drafts 1..K are all accepted, from the longest fixed K measured."""
        fixed = [k for k in self.rows if k is not None]
        if not fixed:
            return {}
        out: dict[str, list[float]] = {}
        for clients in self.clients:
            cell = self.cells.get((clients, max(fixed)))
            for name, drafted in (cell.drafted if cell else {}).items():
                if name in out:
                    continue
                accepted = cell.accepted[name]
                out[name] = [a / d if d else 0.0 for a, d in zip(accepted, drafted)]
        return out

    def ceiling(self, clients: int) -> tuple[float, int] | None:
        """Tokens per second of the ideal schedule at this client count, and the largest K it drafts."""
        target, draft = self.lines(clients)
        survival = self.survival()
        if target is None or not survival:
            return None
        names = sorted(survival)
        tokens = seconds = 0.0
        deepest = 0
        for start in range(len(names)):  # the client i runs prompt i + j: every mix in turn
            slots = [survival[names[(start + i) % len(names)]] for i in range(clients)]
            step = best_step(slots, target, draft)
            # each slot's requests whole: max_tokens in their expected steps, the last one's drafts cut
            tokens += sum(self.max_tokens / request_steps(s, k, self.max_tokens) for s, k in zip(slots, step.ks))
            seconds, deepest = seconds + step.seconds, max(deepest, step.deepest)
        return tokens / seconds, deepest


@dataclass(frozen=True)
class Step:
    """One step of the ideal schedule: its expected tokens (steady: no request ending in it), its seconds,
    its draft passes, and each slot's K."""

    tokens: float
    seconds: float
    deepest: int
    ks: tuple[int, ...]


def best_step(slots: Sequence[Sequence[float]], target: Line, draft: Line | None) -> Step:
    """The step with the most expected tokens per second when slot i's j-th draft survives with
    slots[i][j]: each slot its own K, up to the deepest, D draft passes of every slot and one verify
    pass of all tokens."""
    n = len(slots)
    best = Step(float(n), target(n), 0, (0,) * n)
    for deepest in range(1, max(map(len, slots), default=0) + 1):
        if draft is None:
            break
        # a slot's drafts survive less the deeper they go: the best gains taken are a first few of each
        gains = sorted(((g, i) for i, s in enumerate(slots) for g in s[:deepest]), reverse=True)
        fixed_s = deepest * draft(n)
        tokens, ks = float(n), [0] * n
        for taken, (gain, slot) in enumerate(gains, 1):
            tokens += gain
            ks[slot] += 1
            seconds = fixed_s + target(n + taken)
            if tokens / seconds > best.tokens / best.seconds:
                best = Step(tokens, seconds, deepest, tuple(ks))
    return best


def request_steps(survival: Sequence[float], k: int, tokens: int) -> float:
    """The expected steps that write `tokens` tokens drafting k a step (at most one fewer than the
    tokens left, as the loop drafts nothing past the answer), when drafts 1..j all survive with
    survival[j - 1]."""
    reach, sure = [1.0], 1.0
    for chance in survival[:k]:  # measured: made non-increasing along the draft
        sure = min(sure, chance)
        reach.append(sure)
    steps = [0.0] * (tokens + 1)
    for left in range(1, tokens + 1):
        drafts = min(len(reach) - 1, left - 1)
        ends = [*reach[: drafts + 1], 0.0]  # the step writes j + 1 tokens with ends[j] - ends[j + 1]
        steps[left] = 1.0 + sum((ends[j] - ends[j + 1]) * steps[left - 1 - j] for j in range(drafts + 1))
    return steps[tokens]


def run_concurrent(
    engine: Engine,
    prompts: Sequence[Prompt],
    settings: BenchSettings,
    clients: Sequence[int],
    rows: Sequence[int | None],
    progress: Callable[[str], None] = lambda label: None,
) -> ConcurrentReport:
    """Time every row at every client count, `settings.runs` rounds, interleaved (see the module)."""
    report = ConcurrentReport(engine.target_model.name, engine.slots, settings.max_tokens, list(rows), list(clients))
    loop = engine.loop
    texts: dict[tuple[str, int], tuple[int, list[int]]] = {}  # (prompt, run) -> the first row's tokens
    if settings.warmup:
        for k in rows:
            _clients(engine, prompts, settings, 1, k, WARMUP_TOKENS, 0)
    for run in range(settings.runs):
        turned = [*rows[run % len(rows) :], *rows[: run % len(rows)]]  # no row always runs first or after another
        for n in clients:
            for k in turned:
                progress(f"round {run + 1}: {n} client(s), K={k or 'auto'}")
                loop.passes = report.passes.setdefault(n, [])
                steps, outside = loop.steps, loop.outside_s
                try:
                    seconds, results = _clients(engine, prompts, settings, n, k, settings.max_tokens, run)
                finally:
                    loop.passes = None
                done, spent = report.outside.get(n, (0, 0.0))
                report.outside[n] = (done + loop.steps - steps, spent + loop.outside_s - outside)
                cell = report.cells.setdefault((n, k), Cell())
                cell.rates.append(sum(len(r.tokens) for _, r in results) / seconds)
                cell.steps, cell.outside_s = cell.steps + loop.steps - steps, cell.outside_s + loop.outside_s - outside
                for prompt, result in results:
                    _count(cell, prompt.name, result)
                    if settings.greedy:
                        _compare(texts, report.mismatches, prompt.name, k, result.tokens)
    return report


def _clients(engine, prompts, settings, n: int, k: int | None, max_tokens: int, run: int):
    """n clients at once, client i running the prompts from prompt i on; (wall seconds, results). Their
    first requests are admitted at the same turn of the step loop: started by their threads, a busy
    machine may run one client's first answers before another client's thread has asked."""
    results: list[tuple[Prompt, object]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def request(prompt: Prompt) -> Request:
        return Request(
            prompt.prompt,
            system=prompt.system,
            max_tokens=max_tokens,
            ignore_eos=True,
            sampling=SamplingSettings(temperature=settings.temperature, seed=settings.seed + run),
            speculation=SpeculationSettings(k),
        )

    def client(i: int, first) -> None:
        try:
            for j in range(len(prompts)):
                prompt = prompts[(i + j) % len(prompts)]
                if j == 0:
                    ticket, pieces = first
                else:
                    asked = request(prompt)
                    ticket, pieces = stream(engine.loop, asked, engine.prompt_tokens(asked))
                for _ in pieces:
                    pass
                with lock:
                    results.append((prompt, ticket.generation.result))
        except BaseException as exc:  # noqa: BLE001 - raised again on the calling thread
            errors.append(exc)

    firsts = [request(prompts[i % len(prompts)]) for i in range(n)]
    tokens = [engine.prompt_tokens(asked) for asked in firsts]
    started = time.perf_counter()
    with engine.loop.together():
        streams = [stream(engine.loop, asked, prompt) for asked, prompt in zip(firsts, tokens)]
    threads = [threading.Thread(target=client, args=(i, streams[i]), name=f"bench-client-{i}") for i in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - started
    if errors:
        raise errors[0]
    return seconds, results


def _count(cell: Cell, name: str, result) -> None:
    spec = result.speculation
    drafted, accepted = cell.drafted.setdefault(name, []), cell.accepted.setdefault(name, [])
    for position, (d, a) in enumerate(zip(spec.drafted_by_position, spec.accepted_by_position)):
        if position == len(drafted):
            drafted.append(0)
            accepted.append(0)
        drafted[position] += d
        accepted[position] += a


def _compare(texts, mismatches: list[str], name: str, k: int | None, tokens: list[int]) -> None:
    first = texts.setdefault(name, (k, list(tokens)))
    if first[1] != list(tokens):
        at = next((i for i, (a, b) in enumerate(zip(first[1], tokens)) if a != b), min(len(first[1]), len(tokens)))
        mismatches.append(f"{name}: K={k or 'auto'} parts from K={first[0] or 'auto'} at token {at}")


def format_concurrent(report: ConcurrentReport) -> str:
    """The table: each client count's rows, median tok/s in all (min–max), and the ceiling with its share."""
    label = {None: "auto"} | {k: f"K={k}" for k in report.rows if k is not None}
    rounds = max((len(cell.rates) for cell in report.cells.values()), default=0)
    head = f"{report.model}, in process (no HTTP), {report.slots} slots, {report.max_tokens} tokens a request"
    out = [
        f"{head}, {rounds} round(s) interleaved",
        f"{'clients':>7}  {'row':<8} {'tok/s in all':>12}  {'min–max':<13} {'÷ ceiling':>9}  {'python/step':>11}",
    ]
    for n in report.clients:
        ceiling = report.ceiling(n)
        for k in report.rows:
            cell = report.cells[(n, k)]
            share = f"{cell.median / ceiling[0]:.2f}" if ceiling else "-"
            spread = f"{min(cell.rates):.1f}–{max(cell.rates):.1f}"
            out.append(f"{n:>7}  {label[k]:<8} {cell.median:>12.1f}  {spread:<13} {share:>9}  {cell.python:>11}")
        if ceiling:
            target, draft = report.lines(n)
            costs = f"target {target.fixed_s * 1e3:.1f} ms + {target.per_s * 1e3:.2f} ms/token"
            if draft is not None:
                costs += f", draft {draft.fixed_s * 1e3:.1f} ms + {draft.per_s * 1e3:.2f} ms/sequence"
            out.append(f"{n:>7}  {'ceiling':<8} {ceiling[0]:>12.1f}  (best K per slot, up to {ceiling[1]}; {costs})")
        steps, outside = report.outside.get(n, (0, 0.0))
        if steps:
            out.append(f"{n:>7}  {'python':<8} {outside / steps * 1e3:>12.2f}  ms a step outside llama.cpp's passes")
    if report.mismatches:
        out.append(f"greedy texts that differ between rows: {len(report.mismatches)}")
        out.extend(f"  {line}" for line in report.mismatches)
    return "\n".join(out)
