"""Learned K costs for -k auto: what a draft step and each verify batch cost with this pair and setup,
timed once (then cached on disk), refined by every request's AutoK, and kept for the next process."""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

from ollama_spec.decoding.k_fixed import FixedK, KPolicy
from ollama_spec.decoding.k_policy import AutoK
from ollama_spec.decoding.k_tuning import stops_min_draft_s
from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.pass_prices import PassPrices
from ollama_spec.decoding.proposer_table import PROPOSERS
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.decoding.step_costs import StepCosts
from ollama_spec.engine.calibration import StepCostCache, calibration_context, cost_key, measure_step_costs
from ollama_spec.engine.cpu_wait import CpuWait
from ollama_spec.llama.model import LoadedModel
from ollama_spec.llama.threads import apart
from ollama_spec.planning.placement import Placement

# What the target reads while its step costs are timed: ordinary text (only its length matters).
CALIBRATION_TEXT = "The quick brown fox jumps over the lazy dog while the sun sets slowly over the hills. "


# A learned verify batch this many times dearer than the calibration's is not a cost of the pair's.
LEARNED_AT_MOST = 2.0
# A calibration this many times dearer than the step loop's passes timed the same sizes since was taken
# while the machine was busy (one spinning process on a loaded 2-core VM made the demo pair's 40 ms pass
# take 1 s in it, and its draft step 44x): see LearnedCosts._check_calibration. Not closer: the loop's
# passes read at other depths than the calibration's 256 tokens (on the tests' tiny pair, whose cost is
# mostly attention, passes at 32 tokens cost 0.65-0.75 of those at 256).
CALIBRATION_AT_MOST = 2.0
# Within a request, the calibration the passes price from is checked against them (`_check_calibration`)
# once this many target passes ran since: a busy one then goes within the first seconds of a long answer,
# not at the next request. About every STALE_PASSES (decoding/pass_prices.py): each size's price follows
# its last ~10 passes, and a check (a median over the sizes' prices) costs ~20-60 us of Python. Within a
# request, once their time adds up to CHECK_EVERY_S as well: on the tiny pair (0.2 ms passes) a check
# every 16 passes and at every request was ~4 us of each 0.4 ms step. A request's start checks it where
# either is due.
CHECK_EVERY_PASSES = 16
CHECK_EVERY_S = 0.05
# A calibration says how far it is this often: the demo pair's 90 timed steps take 10 s on an idle
# 2-core VM and 3 minutes on a loaded one, where a user must tell it from a hang. Each note
# is made between steps, outside their timing.
NOTICE_EVERY_S = 4.0


class LearnedCosts:
    """The step costs of one loaded pair: as calibrated, and as requests have learned them since."""

    def __init__(
        self, target: LoadedModel, draft: LoadedModel | None, placement: Placement, notice: Callable[[str], None]
    ):
        self.target, self.draft = target, draft
        self.placement = placement  # as asked, not as the memory plan split it
        self.notice = notice
        self.cache = StepCostCache()
        self.learned: dict[str, StepCosts] = {}  # by cost key: refined by AutoK during requests
        self.last_policies: dict[str, AutoK] = {}  # by cost key: what the last request learned of α and margins
        self._keys: dict[Path | None, str] = {}  # `key` by the draft's path: the loaded setup's, worked out once
        # what the step loop's passes cost, learned as they run (engine/step_loop.py): it prices each
        # step by them, a calibration only their prior
        self.passes = PassPrices()
        self._prior_key: str | None = None  # whose calibration the passes price from
        # cost keys whose calibration was timed busy (cpu_wait.py) or the passes found too dear: not used again
        self._busy: set[str] = set()
        self._uncached: dict[str, StepCosts] = {}  # by cost key: calibrations timed busy, this process's only
        self._unchecked, self._checked_at_s = 0, 0.0  # target passes since the last check; their seconds then
        # no timing before a request: without a calibration cached, -k auto starts from the passes'
        # prior shape and the step loop prices it from its first passes (serve: no wait at load)
        self.online = False

    def k_policy(self, speculation: SpeculationSettings, sampling: SamplingSettings) -> KPolicy:
        """Fixed K, or for "auto" a policy seeded with this machine's measured step costs."""
        if not speculation.auto:
            return FixedK(speculation.num_speculative_tokens)
        draft, k_max = self._draft_for(speculation), speculation.max_speculative_tokens
        key = self.key(draft)
        # Greedy text does not depend on K; a seeded sample does, so K must not follow the clock.
        # A draft model reports its margin for each token, so it can stop token by token.
        learn = sampling.greedy or sampling.seed is None
        if self._unchecked >= CHECK_EVERY_PASSES or self._check_due():
            self._check_calibration()
        earlier = self.last_policies.get(key) if learn else None
        if learn and (key in self._busy or self.online and self.cache.get(key) is None):
            # the step loop reprices it as it runs: from the prices the request before had (carry_over)
            priced = earlier.priced if earlier is not None else None
            if priced is None or priced.k_max != k_max:
                priced = self.passes.step_costs(k_max, drafts=draft is not None)
            calibrated = costs = priced
        else:
            calibrated = self.calibrated(draft, k_max)
            costs = self._learned_or(calibrated, key) if learn else calibrated
            if learn:
                self.passes.set_prior(calibrated)
                self._prior_key = key
        policy = AutoK(
            costs,
            learn_costs=learn,
            confidence_stops=PROPOSERS[speculation.proposer].needs_draft,
            calibrated=calibrated,
            stops_min_draft_s=stops_min_draft_s(draft.n_vocab if draft is not None else 0),  # no draft: no stops
        )
        if not learn:  # a seeded sample starts from the prior: its text must not depend on history
            return policy
        if earlier is not None:
            policy.carry_over(earlier)
        elif policy.confidence_stops and (learned := self.cache.get_acceptance(key)) is not None:
            policy.seed_acceptance(learned)  # the cache file read only where no earlier request's policy is
        return policy

    def observe(self, draft: bool, size: int, seconds: float) -> None:
        """A pass the step loop ran (see PassPrices.observe); every CHECK_EVERY_PASSES target passes the
        calibration they price from is checked against them, so that one timed while the machine was
        busy goes within the request under way."""
        self.passes.observe(draft, size, seconds)
        if not draft:
            self._unchecked += 1
            if self._unchecked >= CHECK_EVERY_PASSES and self._check_due():
                self._check_calibration()

    def keep_learned(self, speculation: SpeculationSettings, policy: KPolicy | None, shared: bool = False) -> None:
        """After a request: the costs an AutoK refined seed the next request's, and the cache on `save`;
        `shared`: it ran beside other slots, and learned its part of shared batches, not the costs of a
        step (only what it learned of the acceptance carries)."""
        if isinstance(policy, AutoK) and policy.learn_costs:
            key = self.key(self._draft_for(speculation))
            self.last_policies[key] = policy
            if shared:
                return
            base = self.learned.get(key) or self.cache.get_learned(key) or self.cache.get(key)
            self.learned[key] = _overlay(base, policy.costs)

    def step_costs(self, draft: LoadedModel | None, k_max: int) -> StepCosts:
        """Draft step and verify batch costs up to k_max + 1 tokens: as learned by earlier requests (this
        process's, else the last one's), else as calibrated."""
        return self._learned_or(self.calibrated(draft, k_max), self.key(draft))

    def _learned_or(self, calibrated: StepCosts, key: str) -> StepCosts:
        """What requests learned (this process's, else the last one's) up to calibrated's K_max, else calibrated."""
        learned = self.learned.get(key) or self.cache.get_learned(key)
        if learned is None or learned.k_max < calibrated.k_max:
            return calibrated
        if learned.verify_s[1] > LEARNED_AT_MOST * calibrated.verify_s[1]:
            # far dearer than timed: learned from batches shared with other slots before each slot
            # had its own clock (a batch of 2 saved as 200 ms where it takes 40), not the pair's
            return calibrated
        return StepCosts(learned.draft_step_s, learned.verify_s[: calibrated.k_max + 1])

    def calibrated(self, draft: LoadedModel | None, k_max: int) -> StepCosts:
        """The costs as timed on this machine, batch size by batch size (cached, else measured now).

        Kept apart from what requests learn, which is a line: the calibration keeps the bumps of
        llama.cpp's kernels that AutoK takes free tokens from."""
        key = self.key(draft)
        costs = self.cache.get(key) or self._uncached.get(key)
        if costs is None or costs.k_max < k_max:
            self.notice(
                "timing this machine's draft and verify steps for -k auto (once per pair and setup, then cached)"
            )
            filler = self.target.tokenize(CALIBRATION_TEXT, add_bos=self.target.add_bos, special=False)
            context = calibration_context(self.target.n_ctx, k_max, filler)
            progress = _Progress(self.notice)
            with CpuWait() as wait:  # apart: no OpenMP team left behind on this thread (llama/threads.py)
                costs = apart(
                    lambda stop: measure_step_costs(self.target, draft, k_max, context, progress=progress.until(stop))
                )
            progress.finish()
            self.learned.pop(key, None)
            if wait.busy:  # the spell's costs, not the pair's: the passes price alone, and the next load times again
                self.notice(f"the machine was busy while the steps were timed ({wait}): not cached")
                self._uncached[key] = costs
                self._busy.add(key)
            else:
                self.cache.put(key, costs)
        return StepCosts(costs.draft_step_s, costs.verify_s[: k_max + 1])

    def prepare(self, speculation: SpeculationSettings) -> None:
        """Time this machine's steps now if -k auto will want them (a server does it while loading:
        its first request then waits for nothing, and no timing runs beside other slots' batches)."""
        if speculation.auto and self.drafts(speculation):
            self.calibrated(self._draft_for(speculation), speculation.max_speculative_tokens)

    def drafts(self, speculation: SpeculationSettings) -> bool:
        """Will anything propose tokens under these settings? Not where the proposer needs a draft
        model and none is loaded: then the target runs alone, and nothing is worth timing."""
        return self.draft is not None or not PROPOSERS[speculation.proposer].needs_draft

    def _draft_for(self, speculation: SpeculationSettings) -> LoadedModel | None:
        return self.draft if PROPOSERS[speculation.proposer].needs_draft else None

    def key(self, draft: LoadedModel | None) -> str:
        """The cache key of this setup with `draft` (None: the target alone, as n-gram lookup runs it),
        worked out once: every -k auto request asks it three times, and each reads both files' sizes."""
        path = draft.path if draft is not None else None
        key = self._keys.get(path)
        if key is None:
            key = self._keys[path] = self._key(draft)
        return key

    def _key(self, draft: LoadedModel | None) -> str:
        # a target spread over RPC servers or GPUs has other step costs than one on this machine's default;
        # keyed by what was asked, not by the split the memory plan derived from this moment's free memory
        target, asked = self.target.settings, self.placement
        extra = {} if asked.is_default else {"placement": asked}
        if target.lora_adapters:  # an adapter adds a little to every step of its layers
            extra["adapters"] = ",".join(str(p) for p in target.lora_adapters)
        return cost_key(
            self.target.path,
            draft.path if draft else None,
            threads=self.target.n_threads,
            target_gpu_layers=target.n_gpu_layers,
            draft_gpu_layers=draft.settings.n_gpu_layers if draft else None,
            kv_type=target.kv_type,
            flash_attention=target.flash_attention,
            **extra,
        )

    def save(self) -> None:
        """What this session learned, into the cache for the next one; a calibration the passes found too
        dear is forgotten with what was learned beside it (the next process times the steps again)."""
        for key, costs in self.learned.items():
            self.cache.put_learned(key, _overlay(self.cache.get_learned(key), costs))
        for key, policy in self.last_policies.items():
            if policy.confidence_stops:
                self.cache.put_acceptance(key, policy.by_margin.bands)
        self._check_calibration()
        for key in self._busy:
            self.cache.forget(key)
        self.learned.clear()
        self.last_policies.clear()

    def _check_due(self) -> bool:
        return self.passes.target_s - self._checked_at_s >= CHECK_EVERY_S

    def _check_calibration(self) -> None:
        """Set the calibration the passes price from aside where they found it CALIBRATION_AT_MOST times
        too dear: the target's sizes (the median of the ratios, each size as timed lately, else as the
        prior scaled by those), or the draft's step. Its shape goes with its level: a busy moment times
        the sizes askew (a batch of 8 twice one of 9), and the sizes the loop has not run would keep it.
        The passes then price alone, as with no calibration (serve's way), requests start from them,
        and `save` forgets it. Before any pass they are the calibration itself."""
        prior, key = self.passes.prior, self._prior_key
        self._unchecked, self._checked_at_s = 0, self.passes.target_s
        if prior is None or key is None:
            return
        now = self.passes.step_costs(prior.k_max, drafts=prior.draft_step_s > 0)
        target = statistics.median(p / n for p, n in zip(prior.verify_s, now.verify_s))
        draft = prior.draft_step_s / now.draft_step_s if now.draft_step_s > 0 else 1.0
        if max(target, draft) > CALIBRATION_AT_MOST:
            self._busy.add(key)
            self.passes.set_prior(None)
            self._prior_key = None


def _overlay(base: StepCosts | None, learned: StepCosts) -> StepCosts:
    """`learned` over `base`: a policy learns the costs up to its own K_max; longer batches keep theirs."""
    if base is None or base.k_max <= learned.k_max:
        return learned
    return StepCosts(learned.draft_step_s, learned.verify_s + base.verify_s[learned.k_max + 1 :])


class _Progress:
    """A calibration's progress as notes, at most one every NOTICE_EVERY_S; how long it took, if it said."""

    def __init__(self, notice: Callable[[str], None]):
        self.notice = notice
        self.start = self.said_at = time.monotonic()
        self.said = False

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if now - self.said_at >= NOTICE_EVERY_S:
            self.said_at, self.said = now, True
            self.notice(f"timing steps for -k auto: {done} of {total}, {now - self.start:.0f} s")

    def until(self, stop: threading.Event) -> Callable[[int, int], None]:
        """This progress, and the caller's interrupt raised between two timed steps once `stop` is set."""

        def report(done: int, total: int) -> None:
            if stop.is_set():
                raise KeyboardInterrupt
            self(done, total)

        return report

    def finish(self) -> None:
        if self.said:  # a short one said its one line; a long one says it is over, and what it cost
            self.notice(f"timed this machine's steps for -k auto in {time.monotonic() - self.start:.0f} s")
