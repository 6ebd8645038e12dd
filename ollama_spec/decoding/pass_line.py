"""What a pass costs beside other slots: one line a + b·size through a model's recent passes.

Beside other slots the step's K is chosen on differences between passes of near sizes: a further
draft column costs the target pass of B more tokens (decoding/batch_steps.py). Priced size by size
(decoding/pass_prices.py: the fastest of each size's last few passes), each difference is the noise
of two minima, and the sizes run most often look cheapest: on a simulated clock with passes ±15 %
and 3 % of them 3× (the demo pair, 8 slots), the target of 40 tokens was priced 229 ms and that of
48 tokens 172 ms against 195 and 227, and the rate the plan promised (what a further column must
beat) 20-40 % above what the steps made, so the batch stopped drafting at its first column on one
step in five. One line through the last RECENT passes of every size learns each difference from all
of them. A pass slower than WINSORIZE times the fastest of its size's last FASTEST_OF passes (a
descheduled one) counts as that much: capped by the line itself, the cap rose with every capped pass,
and where passes are descheduled often the line settled at several times what they cost (a machine kept
busy by two other processes: the tiny pair's draft passes beside 4 slots, 0.15 ms, priced 0.8-1.3 ms).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any

RECENT = 48  # passes the line is fitted through: ~48 steps' target passes, each step's draft passes
WINSORIZE = 1.5  # a pass counts as at most this many times the fastest of its size's last FASTEST_OF
FASTEST_OF = 5
MIN_PASSES = 8  # a line from fewer passes is no price
SPREAD = 1.5  # the sizes seen must span this ratio for a slope (else the caller's prices stand)
# A step at K >= 2 changes its draft passes' shape twice (the first reads each slot's bonus token beside its
# last draft, the rest one token each) where one at K=1 keeps it, and llama.cpp builds a model's graph again
# for a pass of another shape: on the tiny pair at 2 slots a K=1 step's draft pass took 144 us, a K=2
# step's two 185 and 173 (llama.cpp's calls alone), and priced without it a K=2 step made a token in 97
# us against K=1's 99 where it took 110: the plan drafted K=2-3 at 6 % of the steps of 2 clients. What a
# pass of another shape costs more is read from the fastest of the last RESHAPED such passes of as many
# rows (at K=1: each step that drafted one token for every slot and had all of them rejected, then the
# next), those within RESHAPED_STALE draft passes.
RESHAPED = 5
RESHAPED_STALE = 4096


@dataclass
class PassLine:
    """Recent passes of one model as (size, seconds), and the least-squares line through them, its sums
    kept running (the sizes' spread and the cheapest pass are read from the RECENT passes kept once a
    price is asked). Every pass of a lone slot is told and none priced here: the
    passes wait in `_told` and are taken in, in order, when a price is asked (on the tiny pair taking
    each in at once was a sixth of -k auto's bookkeeping a step)."""

    _passes: deque[tuple[int, float]] = field(default_factory=deque)
    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # n, Σx, Σxx, Σy, Σxy
    _fit: tuple[tuple[float, float] | None] | None = None  # (`line`,), until a pass
    _floor: float | None = None  # `at`'s floor, until a pass
    # passes told and not taken in yet: the last RECENT (one told before those would leave the line's
    # passes before a price was asked)
    _told: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=RECENT))
    _by_size: dict[int, deque[float]] = field(default_factory=dict)  # each size's last FASTEST_OF, as timed

    def observe(self, size: int, seconds: float) -> None:
        """A pass of `size` (tokens or rows) took `seconds`."""
        self._told.append((size, seconds))

    def _take_in(self) -> None:
        """The passes told since the last price, each winsorized (the line fitted once they are in, not
        after each: on the tiny pair, fitted pass by pass, the line's upkeep was half of what the step
        loop's choice of K took, ~10 us a step at 4 slots)."""
        told, passes, by_size = self._told, self._passes, self._by_size
        n, sx, sxx, sy, sxy = self._sums
        for size, seconds in told:
            recent = by_size.get(size)
            if recent is None:
                recent = by_size[size] = deque(maxlen=FASTEST_OF)
            recent.append(seconds)
            seconds = min(seconds, WINSORIZE * min(recent))
            n, sx, sxx, sy, sxy = n + 1, sx + size, sxx + size * size, sy + seconds, sxy + size * seconds
            passes.append((size, seconds))
            if len(passes) > RECENT:
                x, y = passes.popleft()
                n, sx, sxx, sy, sxy = n - 1, sx - x, sxx - x * x, sy - y, sxy - x * y
        self._sums = [n, sx, sxx, sy, sxy]
        told.clear()
        self._fit = self._floor = None

    def line(self) -> tuple[float, float] | None:
        """(a, b ≥ 0) with seconds = a + b·size, or None where the passes are too few or their sizes
        do not spread (SPREAD)."""
        if self._told:
            self._take_in()
        return self._line()

    def _line(self) -> tuple[float, float] | None:
        if self._fit is None:
            self._fit = self._fitted()
        return self._fit[0]

    def _fitted(self) -> tuple[tuple[float, float] | None]:
        n, sx, sxx, sy, sxy = self._sums
        if n < MIN_PASSES:
            return (None,)
        spread = n * sxx - sx * sx
        # the passes compare by size first: their min and max sizes without a list (a third of the time)
        if spread <= 0 or max(self._passes)[0] < SPREAD * min(self._passes)[0]:
            return (None,)
        slope = max(0.0, (n * sxy - sx * sy) / spread)
        intercept = sy / n - slope * sx / n
        if intercept < 0:  # no pass costs less than nothing: the least-squares line through the origin
            intercept, slope = 0.0, sxy / sxx
        return ((intercept, slope),)

    def at(self, size: int) -> float | None:
        """A pass of `size` on the line (never under half the cheapest pass seen), or None (`line`)."""
        line = self.line()
        if line is None:
            return None
        if self._floor is None:
            self._floor = 0.5 * min(self._passes, key=itemgetter(1))[1]
        return max(line[0] + line[1] * size, self._floor)


@dataclass
class LinePrices:
    """Passes priced on each model's line where it has one (`at`), else by `prices` (a PassPrices).

    The target has a line for each number of sequences in its passes (`beside`): a pass's Python (each
    sequence's rows read, verified, its next step begun) grows with its sequences, not its tokens. On one
    line, at 8 slots of the tiny pair, the passes of fewer sequences as slots came and went (fewer tokens,
    as dear or dearer) laid it flat, and K=3's 32 tokens were priced as K=1's 16: the batch drafted K=2-4
    for whole rounds at 0.88x of K=1's tokens a second."""

    prices: Any
    draft: PassLine = field(default_factory=PassLine)
    target: PassLine = field(init=False)  # the line of the sequences asked about (`beside`)
    _targets: dict[int, PassLine] = field(default_factory=dict)  # by the sequences in a pass
    # by rows, the last RESHAPED draft passes whose shape differed from the draft pass before (`reshape_s`),
    # each with the count of draft passes it came at
    _reshaped: dict[int, deque[tuple[float, int]]] = field(default_factory=dict)
    _drafts: int = 0  # draft passes seen

    def __post_init__(self) -> None:
        self.target = self._line_of(1)

    def beside(self, sequences: int) -> LinePrices:
        """These prices, the target's for passes of `sequences` sequences."""
        self.target = self._line_of(sequences)
        return self

    def _line_of(self, sequences: int) -> PassLine:
        # not setdefault: that would build a PassLine (two deques, a list) at every pass only to drop it
        line = self._targets.get(sequences)
        if line is None:
            line = self._targets[sequences] = PassLine()
        return line

    def observe(self, draft: bool, size: int, seconds: float, sequences: int = 1, reshaped: bool = False) -> None:
        """A pass ran: the draft's over `size` rows (`reshaped`: its shape not the draft pass's before it),
        or the target's over `size` tokens (padding counted) of `sequences` sequences."""
        if draft:
            self.draft.observe(size, seconds)
            self._drafts += 1
            if reshaped:
                if (recent := self._reshaped.get(size)) is None:
                    recent = self._reshaped[size] = deque(maxlen=RESHAPED)
                recent.append((seconds, self._drafts))
        else:
            self._line_of(sequences).observe(size, seconds)

    def target_pass(self, tokens: int) -> float:
        return self.target.at(tokens) or self.prices.target_pass(tokens)

    def draft_pass(self, rows: int) -> float:
        return self.draft.at(rows) or self.prices.draft_pass(rows)

    def reshape_s(self, rows: int) -> float:
        """What a draft pass of `rows` rows costs more where its shape is not the draft pass's before it
        (llama.cpp builds the graph again), over its price: the fastest of its last RESHAPED such passes
        within RESHAPED_STALE draft passes, less `draft_pass`; 0 where fewer than two ran (see RESHAPED)."""
        recent = [seconds for seconds, at in self._reshaped.get(rows, ()) if self._drafts - at <= RESHAPED_STALE]
        return max(0.0, min(recent) - self.draft_pass(rows)) if len(recent) >= 2 else 0.0
