"""The draft-verify loop: one generator that the CLI, the server and the benchmark all consume."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from ollama_spec.decoding.evals import Eval, evaluated
from ollama_spec.decoding.grammar import TokenGrammar, masked_rows
from ollama_spec.decoding.k_fixed import FixedK, KPolicy
from ollama_spec.decoding.penalties import adjusted_rows
from ollama_spec.decoding.proposer_table import PROPOSERS, build_proposer, is_lookup
from ollama_spec.decoding.proposers import (
    DEFAULT_NGRAM_SIZE,
    DRAFT,
    FREE_LOOKUP_TOKENS,
    HYBRID,  # noqa: F401 - callers take it from here
    Model,
    Proposer,
    keep_common_prefix,
)
from ollama_spec.decoding.sampling import SamplingSettings, logits_to_probs, token_logprobs
from ollama_spec.decoding.step_costs import estimate_alpha
from ollama_spec.decoding.verify import verify_greedy, verify_rejection
from ollama_spec.errors import InferenceError, InvalidSetting
from ollama_spec.planning.needs import N_UBATCH

DEFAULT_NUM_SPECULATIVE_TOKENS = 5
DEFAULT_MAX_SPECULATIVE_TOKENS = 16
# The largest fixed K: the K drafts and the token before them are one verify batch, which llama.cpp
# decodes in one pass and the memory check plans for, up to N_UBATCH tokens.
MAX_NUM_SPECULATIVE_TOKENS = N_UBATCH - 1


# The most prompt tokens an evaluation reads, or a function that says it each time from the tokens left
# to read and those there were to read at first (0: the first step reads what is left)
PromptChunk = int | Callable[[int, int], int]


@dataclass(frozen=True)
class SpeculationSettings:
    # None: "auto", the K that the measured costs and the live acceptance say is fastest, each step.
    num_speculative_tokens: int | None = DEFAULT_NUM_SPECULATIVE_TOKENS
    # Stop drafting early when the draft's most likely next token has less probability than
    # this (llama.cpp's --draft-p-min); 0 always drafts K tokens.
    draft_p_min: float = 0.0
    max_speculative_tokens: int = DEFAULT_MAX_SPECULATIVE_TOKENS  # auto's upper bound
    # A name in PROPOSERS: "draft", the draft model proposes; "ngram", prompt lookup (no draft model
    # needed); "draft+ngram", each step whichever of the two is expected to get more tokens accepted.
    proposer: str = DRAFT
    ngram_size: int = DEFAULT_NGRAM_SIZE

    def __post_init__(self) -> None:
        if self.num_speculative_tokens is not None and self.num_speculative_tokens < 1:
            raise InvalidSetting(
                f"-k/--num-speculative-tokens must be at least 1 or 'auto', got {self.num_speculative_tokens}"
            )
        if self.proposer not in PROPOSERS:
            raise InvalidSetting(f"unknown proposer '{self.proposer}': choose {' or '.join(PROPOSERS)}")
        if self.ngram_size < 1:
            raise InvalidSetting(f"--ngram-size must be at least 1, got {self.ngram_size}")
        if self.max_speculative_tokens < 1:
            raise InvalidSetting(f"the largest K for auto must be at least 1, got {self.max_speculative_tokens}")
        if not 0 <= self.draft_p_min < 1:
            raise InvalidSetting(f"--draft-p-min must be in [0, 1), got {self.draft_p_min}")

    @property
    def auto(self) -> bool:
        return self.num_speculative_tokens is None

    def proposer_over(self, draft: Model | None, target_vocab: int) -> Proposer | None:
        """The proposer these settings name (PROPOSERS), drafting with `draft` where it needs a draft
        model; None where it needs one and there is none."""
        return build_proposer(
            self.proposer, draft, target_vocab, draft_p_min=self.draft_p_min, ngram_size=self.ngram_size
        )


@dataclass
class SpeculationStats:
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    generated: int = 0
    prompt_cached: int = 0  # prompt tokens the target already held from an earlier request
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    rejections: int = 0  # steps that ended on a rejected draft (the drafts after it were never tried)
    accepted_by_position: list[int] = field(default_factory=list)
    drafted_by_position: list[int] = field(default_factory=list)
    k_chosen: dict[int, int] = field(default_factory=dict)  # K -> steps that drafted K tokens
    # by who proposed them ("draft", "ngram"): with both at work, which source each accepted token came from
    drafted_by_source: dict[str, int] = field(default_factory=dict)
    accepted_by_source: dict[str, int] = field(default_factory=dict)
    # with Request.trace_batches: each target batch as (its first position, its tokens), in order, so
    # that a greedy difference can be replayed on a cache built as this run built it (near_ties.py)
    batches: list[tuple[int, int]] | None = None
    last_step: tuple[int, int, str | None] = (0, 0, None)  # drafted, accepted, source: for keep()

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def alpha(self) -> float | None:
        """The probability that a tried draft token is accepted (Leviathan et al.'s α)."""
        return estimate_alpha(self.accepted, self.rejections)

    @property
    def mean_accepted_per_step(self) -> float:
        """Tokens emitted per target pass: accepted drafts plus the target's own token."""
        return self.generated / self.steps if self.steps else 0.0

    def record(self, n_drafted: int, n_accepted: int, k: int | None = None, source: str | None = None) -> None:
        self.steps += 1
        self.last_step = (n_drafted, n_accepted, source)
        if source is not None and n_drafted:
            self.drafted_by_source[source] = self.drafted_by_source.get(source, 0) + n_drafted
            self.accepted_by_source[source] = self.accepted_by_source.get(source, 0) + n_accepted
        self.drafted += n_drafted
        self.accepted += n_accepted
        self.rejections += n_accepted < n_drafted
        if k is not None:
            self.k_chosen[k] = self.k_chosen.get(k, 0) + 1
        for position in range(n_drafted):
            if position == len(self.drafted_by_position):
                self.drafted_by_position.append(0)
                self.accepted_by_position.append(0)
            self.drafted_by_position[position] += 1
            self.accepted_by_position[position] += position < n_accepted

    def keep(self, kept: int) -> None:
        """The answer kept `kept` of the `generated` tokens: it ended inside the last step (max_tokens,
        a stop, the end of turn, itself not kept). That step's drafts for places past the answer's last
        token are not counted, accepted or not, so that accepted <= kept and the counts describe the
        answer (counting them, a 24-token answer could report 28 accepted)."""
        n_drafted, n_accepted, source = self.last_step
        in_answer = max(0, n_accepted + 1 - (self.generated - kept))  # the last step's tokens kept
        drafted, accepted = min(n_drafted, in_answer), min(n_accepted, in_answer)
        self.generated = min(self.generated, kept)
        if (drafted, accepted) == (n_drafted, n_accepted):
            return
        self.drafted -= n_drafted - drafted
        self.accepted -= n_accepted - accepted
        self.rejections -= n_accepted < n_drafted and accepted == in_answer  # the rejected draft lay past it
        for position in range(drafted, n_drafted):
            self.drafted_by_position[position] -= 1
            self.accepted_by_position[position] -= position < n_accepted
        while self.drafted_by_position and not self.drafted_by_position[-1]:  # a place only that step drafted
            self.drafted_by_position.pop()
            self.accepted_by_position.pop()
        if source is not None:
            self.drafted_by_source[source] -= n_drafted - drafted
            self.accepted_by_source[source] -= n_accepted - accepted
        self.last_step = (drafted, accepted, source)


@dataclass(frozen=True)
class Token:
    id: int
    from_draft: bool
    logprob: float | None = None  # under the target's distribution, when asked for
    top: tuple[tuple[int, float], ...] = ()  # the target's most likely tokens there, with theirs


def generate_tokens(
    target: Model,
    draft: Model | Proposer | None,
    prompt: Sequence[int],
    sampling: SamplingSettings,
    speculation: SpeculationSettings,
    stats: SpeculationStats | None = None,
    policy: KPolicy | None = None,
    grammar: TokenGrammar | None = None,
    logprobs: int | None = None,
) -> Iterator[Token]:
    """Yield the target's continuation of `prompt`, token by token, forever (the caller stops): the
    steps of `generate_steps`, each evaluation run directly (a request alone)."""
    return evaluated(generate_steps(target, draft, prompt, sampling, speculation, stats, policy, grammar, logprobs))


def generate_steps(
    target: Model,
    draft: Model | Proposer | None,
    prompt: Sequence[int],
    sampling: SamplingSettings,
    speculation: SpeculationSettings,
    stats: SpeculationStats | None = None,
    policy: KPolicy | None = None,
    grammar: TokenGrammar | None = None,
    logprobs: int | None = None,
    prompt_chunk: PromptChunk | None = None,
    max_new: int | None = None,
) -> Generator[Eval | Token, np.ndarray | None, None]:
    """The target's continuation of `prompt` as steps: each evaluation yielded as an `Eval` (its rows
    sent back: decoding/evals.py), each token as a `Token`, forever (the caller stops).

    `draft` is a proposer, or a draft model that the proposer `speculation.proposer` names drafts
    with; without one this is plain decoding with the target, the baseline. Invariant at the top of
    each step after the first: the target's cache holds `seq[:-1]`. The first step reads the prompt
    and drafts nothing, so the first token comes as soon as the target has read it, as with the
    target alone; with `prompt_chunk`, it reads at most that many tokens an evaluation (or as many as
    `prompt_chunk(tokens left, tokens at first)` says each time, 0 leaving them to the first step), so that a
    long prompt shares the passes with other requests' steps. Whatever the caches already hold of
    the prompt (an earlier turn of the same chat) is kept. `policy` chooses K each step (the engine
    passes `AutoK` for "auto"); by default K is fixed. A `grammar` (structured output) masks the
    target's rows before verification and advances with every emitted token. With `logprobs` (how
    many alternatives), each token carries its log-probability under the target, from the verify
    row that chose it. With `max_new` (the tokens the caller will take at most), no step drafts past
    them: a step emits its accepted drafts and one token more.
    """
    stats, policy, proposer, seq = _started(target, draft, prompt, speculation, stats, policy)
    rng = None if sampling.greedy else np.random.default_rng(sampling.seed)  # greedy draws nothing (54 us a seed)
    if prompt_chunk:
        yield from _prompt_chunks(target, proposer, seq, prompt_chunk)
    first, clock, end = True, time.perf_counter, None if max_new is None else len(seq) + max_new
    while (room := target.n_ctx - len(seq)) >= 0:  # the batch caches what the target lacks of seq, and the drafts
        if end is not None:  # drafts past the answer's last token would be verified for nothing
            room = min(room, max(end - len(seq) - 1, 0))
        start = clock()
        drafted, draft_probs = yield from _proposal(
            None if first else proposer, policy, seq, room, sampling, rng, grammar
        )
        middle = clock()
        if stats.batches is not None:
            stats.batches.append((target.n_past, len(seq) - target.n_past + len(drafted)))
        logits = yield Eval(target, [*seq[target.n_past :], *drafted], len(drafted) + 1)
        logits, n_accepted, next_token = _verdict(logits, seq, drafted, draft_probs, sampling, grammar, logprobs, rng)
        _record(stats, policy, proposer, first, len(drafted), n_accepted, middle - start, clock() - middle)
        first, emitted = False, [*drafted[:n_accepted], next_token]
        if grammar is not None:
            _advance(grammar, emitted)
        seq += emitted
        target.truncate(len(seq) - 1)  # roll back to the accepted prefix: seq[:-1] stays the cached part
        if proposer is not None:
            proposer.accepted(seq)
        stats.generated += n_accepted + 1
        for row, token in enumerate(emitted):
            yield _token(token, row < n_accepted, logits[row], logprobs)


def _started(
    target: Model,
    draft: Model | Proposer | None,
    prompt: Sequence[int],
    speculation: SpeculationSettings,
    stats: SpeculationStats | None,
    policy: KPolicy | None,
) -> tuple[SpeculationStats, KPolicy, Proposer | None, list[int]]:
    """A generation's statistics, K policy, proposer and text, the caches cut back to what they share
    with the prompt."""
    stats = stats if stats is not None else SpeculationStats()
    if policy is None:
        policy = FixedK(speculation.num_speculative_tokens or DEFAULT_NUM_SPECULATIVE_TOKENS)
    # a proposer subclasses Proposer: its MRO says so at once, where isinstance against the runtime-checkable
    # Protocol walks every member (34 us, every request)
    proposer = (
        draft if draft is None or Proposer in type(draft).__mro__ else speculation.proposer_over(draft, target.n_vocab)
    )
    seq = list(prompt)
    stats.prompt_cached = keep_common_prefix(target, seq)
    if proposer is not None:
        proposer.reset(seq)
    return stats, policy, proposer, seq


def _proposal(
    proposer: Proposer | None,
    policy: KPolicy,
    seq: list[int],
    room: int,
    sampling: SamplingSettings,
    rng: np.random.Generator | None,
    grammar: TokenGrammar | None,
) -> Generator[Eval, np.ndarray, tuple[list[int], np.ndarray | None]]:
    """A step's draft tokens and their distributions (None: one-hot, or none drafted), as steps: K as
    the policy says, at most `room`; at K=0, a lookup where one pays (it costs no draft step)."""
    if proposer is None:
        return [], None
    k = min(policy.next_k(), room)
    if k == 0:
        if policy.quiet_steps > 1:
            proposer.idle(seq, policy.quiet_steps)
        return proposer.lookup(seq, min(FREE_LOOKUP_TOKENS, room), policy.lookup_worth), None
    return (yield from proposer.propose_steps(seq, k, sampling, rng, policy.keep_drafting, grammar, policy.probing))


def _verdict(
    logits: np.ndarray,
    seq: list[int],
    drafted: list[int],
    draft_probs: np.ndarray | None,
    sampling: SamplingSettings,
    grammar: TokenGrammar | None,
    logprobs: int | None,
    rng: np.random.Generator | None,
) -> tuple[np.ndarray, int, int]:
    """The target's verify rows as verification reads them (penalties, then the grammar's mask), how
    many drafts they accept, and the token the target adds after those."""
    if sampling.penalties.active:
        logits = adjusted_rows(logits, seq, drafted, sampling.penalties)
    if grammar is not None:  # greedy skips masking rows whose best token is allowed, unless logprobs read them
        logits = masked_rows(grammar, drafted, logits, greedy=sampling.greedy and logprobs is None)
    if sampling.greedy:
        return (logits, *verify_greedy(drafted, logits))
    target_probs = np.stack([logits_to_probs(row, sampling) for row in logits])
    return (logits, *verify_rejection(drafted, draft_probs, target_probs, rng))


def _record(
    stats: SpeculationStats,
    policy: KPolicy,
    proposer: Proposer | None,
    first: bool,
    n_drafted: int,
    n_accepted: int,
    draft_s: float,
    verify_s: float,
) -> None:
    """A step in the statistics and for the K policy; the first, a target pass but no draft-verify
    step, counts as a step only (its time is the prompt's)."""
    if first:
        stats.record(0, 0)
        return
    stats.draft_seconds += draft_s
    stats.verify_seconds += verify_s
    source = proposer.source if proposer is not None else None
    stats.record(n_drafted, n_accepted, n_drafted if proposer is not None else None, source)
    policy.observe(n_drafted, n_accepted, draft_s, verify_s, lookup=is_lookup(source))


def _prompt_chunks(target: Model, proposer: Proposer | None, seq: list[int], chunk: PromptChunk) -> Generator[Eval]:
    """The prompt read `chunk` tokens an evaluation of the target (or as many as `chunk(left, whole)`
    says each time) but its last piece (the first step's), the proposer reading each chunk first (a
    draft model's cache), so that its first draft reads a chunk at most, not the whole prompt in one
    pass beside other requests' steps."""
    whole = len(seq) - 1 - target.n_past
    while (left := len(seq) - 1 - target.n_past) > 0:
        size = chunk(left, whole) if callable(chunk) else chunk if left > chunk else 0
        if not size:
            return
        end = target.n_past + size
        if proposer is not None:
            yield from proposer.read_steps(seq, end)
        yield Eval(target, seq[target.n_past : end])


def _token(token: int, from_draft: bool, row: np.ndarray, logprobs: int | None) -> Token:
    if logprobs is None:
        return Token(token, from_draft)
    logprob, top = token_logprobs(row, token, logprobs)
    return Token(token, from_draft, logprob, top)


def _advance(grammar: TokenGrammar, tokens: Sequence[int]) -> None:
    """Move the grammar past the emitted tokens; verification chose them among the allowed ones, so
    a forbidden one means the grammar allowed nothing at all there."""
    for token in tokens:
        if not grammar.allows(token):
            raise InferenceError("the output grammar allows no token at this point: it cannot be completed")
        grammar.accept(token)
