"""Two ways to propose tokens for the target to verify: a small draft model, or n-gram lookup.

Both answer `propose(seq, k)` with up to k tokens and the distributions they were drawn from
(None: proposed with certainty, a one-hot q), and hear `accepted(seq)` after each verification,
so the loop, the verifier and the statistics are the same for both. They are built by name
(SpeculationSettings.proposer) from proposer_table.PROPOSERS.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from ollama_spec.decoding.acceptance import AcceptanceByPosition, AlphaEstimator
from ollama_spec.decoding.drafting import (
    KeepDrafting,
    draft_token_steps,
    following_rows,
)
from ollama_spec.decoding.evals import Eval, run_evals
from ollama_spec.decoding.grammar import TokenGrammar
from ollama_spec.decoding.k_policy import PROBE_COSTS
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.decoding.sequences import (
    Model,
    as_draft_tokens,
    common_prefix,
    keep_common_prefix,
)
from ollama_spec.decoding.step_costs import worth_a_token

# The proposers' names (PROPOSERS) and the sources a step's tokens come from (Proposer.source).
DRAFT, NGRAM, HYBRID = "draft", "ngram", "draft+ngram"
DEFAULT_NGRAM_SIZE = 4
# A lone matching token ("the", a newline) predicts what follows it about as well as a guess, and
# each such proposal costs a bigger verify batch and drags the acceptance estimate down, so K=auto
# drafts less where matches are long. Measured by replaying greedy texts (8 SmolLM2-135M prompts:
# chat, code edit, quoting; 5 synthetic): lookups of 4..2-grams against 2..1-grams, both at K=auto,
# +9 % (synthetic) to +48 % (SmolLM2) tokens per unit of target time; llama-cpp-python's
# LlamaPromptLookupDecoding, which falls back to 1-grams, trails both.
MIN_NGRAM_SIZE = 2
# A probe after a long stretch at K=0 reads at most this many of the tokens the draft missed, after
# what it holds: enough for the draft's next-token guess, whose acceptance is all a probe asks. A full
# catch-up costs a batch as long as the gap at every probe, however rare: on the quantized synth pair
# (drafting never pays) 9 % of the target's time, 15 ms a probe; reading 16 tokens, 4 ms.
PROBE_WINDOW = 16


# A lookup's acceptance by position -> how many of its tokens to verify (KPolicy.lookup_worth).
LookupWorth = Callable[[Sequence[float]], int]


@runtime_checkable
class Proposer(Protocol):
    """What the loop asks of whoever proposes tokens. A proposer subclasses it and so takes its
    defaults: nothing to reset or forget, and no lookup at K=0; the loop tells one from a bare draft
    model (Model) by that."""

    source: str  # who proposed the last step's tokens: DRAFT (a draft model) or NGRAM (lookup)
    # the most tokens it reads in a step to catch up on what it missed (DraftModelProposer); None: all
    catch_up: int | None = None

    def reset(self, seq: list[int]) -> None:
        """A new sequence starts with `seq` (what is cached of it may be kept)."""

    def lookup(self, seq: list[int], k: int, worth: LookupWorth) -> list[int]:
        """A step where the K policy chose K=0: tokens that cost no draft step (a lookup in the text),
        as many as `worth` says pay; none from a proposer that has nothing of the kind."""
        return []

    def propose(
        self,
        seq: list[int],
        k: int,
        sampling: SamplingSettings,
        rng: np.random.Generator,
        keep_drafting: KeepDrafting | None = None,
        grammar: TokenGrammar | None = None,
        probe: str = "",
    ) -> tuple[list[int], np.ndarray | None]:
        """Up to k tokens to follow `seq`, and q: one row per token, or None for one-hot proposals.

        A proposer that knows its confidence in each token asks `keep_drafting` before drafting it.
        Under a `grammar` (structured output), one that can drafts only tokens it allows. A `probe`
        (KPolicy.probing: the K policy asking whether drafting pays again, PROBE_ACCEPTANCE or
        PROBE_COSTS, or a lone step exploring, PROBE_EXPLORE; "" on other steps) may be proposed more
        cheaply than usual."""

    def propose_steps(self, seq, k, sampling, rng, keep_drafting=None, grammar=None, probe="") -> Generator:
        """`propose` as steps (decoding/evals.py): each evaluation it needs yielded, its rows sent
        back, the proposal returned. A proposer that evaluates nothing proposes at once."""
        return self.propose(seq, k, sampling, rng, keep_drafting, grammar, probe)
        yield  # a generator

    def accepted(self, seq: list[int]) -> None:
        """`seq` is what the target accepted; forget anything proposed past it."""

    def idle(self, seq: list[int], steps: int) -> None:
        """A step at K=0 after `seq`: this and the next `steps` - 1 steps will not draft (the K policy's
        `quiet_steps`). Nothing for a proposer that reads the target's passes for nothing."""

    def read_steps(self, seq: list[int], end: int) -> Generator:
        """Read `seq[:end]` before the first step, as steps (decoding/evals.py): a prompt read in chunks
        beside other requests' steps reaches the proposer a chunk at a time too, never in one pass at its
        first draft. Nothing for a proposer that keeps no cache of the text."""
        return
        yield  # a generator


class DraftModelProposer(Proposer):
    """A small model with the target's vocabulary drafts, token by token, from its own cache.

    llama.cpp pairs vocabularies up to 128 tokens apart (Qwen2.5 7B+ pads past 0.5B): the draft
    proposes only ids both models have, so q lives on the shared ids (the verifier gives the
    target's extra ids q = 0), and the target's ids the draft lacks are fed to it as a stand-in.
    """

    source = DRAFT

    def __init__(self, draft: Model, target_vocab: int, draft_p_min: float = 0.0):
        self.draft, self.draft_p_min = draft, draft_p_min
        self.shared_vocab = min(draft.n_vocab, target_vocab)
        self._synced: int | None = None  # after a windowed probe: how much of the draft's cache is seq's
        # Beside other slots (the engine sets it): the most tokens of what it missed that the draft reads
        # in a step's pass. After a stretch at K=0 it reads one such piece a step, drafting nothing, until
        # the rest fits: read whole, a catch-up of 150 tokens was one draft pass as long as that beside
        # every other slot's one-token rows. None: all at once (a request alone waits for no one).
        self.catch_up: int | None = None

    def reset(self, seq: list[int]) -> None:
        self._synced = None
        keep_common_prefix(self.draft, as_draft_tokens(seq, self.draft.n_vocab))

    def propose(self, seq, k, sampling, rng, keep_drafting=None, grammar=None, probe=""):
        return run_evals(self.propose_steps(seq, k, sampling, rng, keep_drafting, grammar, probe))

    def propose_steps(self, seq, k, sampling, rng, keep_drafting=None, grammar=None, probe=""):
        state = grammar.copy() if grammar is not None else None  # drafted tokens advance a copy only
        try:
            return (yield from self._propose(seq, k, sampling, rng, keep_drafting, state, probe))
        finally:
            if state is not None:
                state.close()

    def _propose(self, seq, k, sampling, rng, keep_drafting, grammar, probe):
        draft, penalties = self.draft, sampling.penalties
        tail = list(penalties.window(seq)) if penalties.active else []
        missed = seq[draft.n_past :]
        if probe and len(missed) > PROBE_WINDOW and (draft.n_past or probe == PROBE_COSTS):
            # Catching up on everything K=0 skipped would cost the draft a batch as long as the gap, at
            # every probe: a fixed share of the target's time, however rarely it probes. The probe reads
            # the gap's end after what the draft holds instead, and `accepted` cuts that off again.
            # A probe of the acceptance does not while the draft holds nothing (a request at K=0 from
            # its first step): a guess from 16 tokens without the prompt is another model's, rejected
            # where the draft with the whole text agreed 96 % of the time (the strong pair), which
            # kept K at 0 for whole requests. It reads the whole text, once.
            self._synced, missed = draft.n_past, missed[-PROBE_WINDOW:]
            if not self._synced:  # a draft that has read nothing still starts from the text's first
                missed = [seq[0], *missed]  # token (BOS), on which models lean (an attention sink)
        elif self.catch_up and not probe and len(missed) > self.catch_up:
            yield Eval(draft, as_draft_tokens(missed[: self.catch_up], draft.n_vocab))
            return [], None
        logits = (yield Eval(draft, as_draft_tokens(missed, draft.n_vocab)))[-1][: self.shared_vocab]

        following = following_rows(draft, self.shared_vocab)
        return (
            yield from draft_token_steps(
                logits, following, k, sampling, rng, keep_drafting, grammar, self.draft_p_min, tail
            )
        )

    def read_steps(self, seq, end):
        if self._synced is None and self.draft.n_past < end:
            yield Eval(self.draft, as_draft_tokens(seq[self.draft.n_past : end], self.draft.n_vocab))

    def accepted(self, seq):
        synced, self._synced = self._synced, None
        self.draft.truncate(min(self.draft.n_past, len(seq) - 1) if synced is None else synced)


# The lookup's acceptance before any of its proposals was tried: a repeated 2-4-gram is followed by
# what followed it before most of the time where text repeats (code edits, quoting), and each
# proposal that misses teaches it otherwise.
NGRAM_PRIOR_ALPHA = 0.8
# A lookup proposal is cut where the chance that all of it is accepted falls below this: past it, the
# verify batch grows for tokens that are mostly rejected.
NGRAM_SURVIVAL_FLOOR = 0.3
DRAFT_RUN_DECAY = 0.9  # per draft-model step: the draft's accepted run follows the last ~10 steps
# While the K policy says drafting does not pay (K=0), a lookup of up to this many tokens is still
# verified where the K policy says its tokens pay for the longer verify batch (NgramProposer.lookup):
# it costs no draft step.
FREE_LOOKUP_TOKENS = 8


class NgramProposer(Proposer):
    """Prompt lookup: find the first earlier occurrence of the text's last n tokens (n = size down to
    2, or 1 when size is 1) and propose what followed it. Free to run, and strong wherever the answer
    repeats its input (code edits, summaries, quoting); proposals are certain, so q is one-hot.

    The first occurrence, not the latest: a match just behind the end has only a few tokens after
    it to propose (measured on the bench's creative prompt: 52-54 tok/s against 42-44).

    It learns its own acceptance by position from the proposals it made, so that a step at K=0 can
    still verify a lookup where one is expected to pay (`lookup`): the K policy's α covers steps,
    but whether a lookup pays depends on this step's match, which only the lookup sees.

    It learns from the lookups it did not propose too (`shadow`): how far the text went on as one
    said is how much of it would have been accepted (for a sample as well: the target draws a
    certain token with the chance that verification accepts it). Else a lookup the K policy prices
    as not paying would never teach otherwise: SmolLM2 quoting ran at 1.02-1.05x of the target
    alone, against 1.19-1.24x learning from the lookups it left (and the prior rule below)."""

    source = NGRAM

    def __init__(self, ngram_size: int = DEFAULT_NGRAM_SIZE):
        self.ngram_size = ngram_size
        self.min_size = min(MIN_NGRAM_SIZE, ngram_size)
        # by the size of the match: a 4-gram found again in a quote is followed as before nearly
        # always, a lone 2-gram in new text seldom; pooled, the misses of one would silence the other
        self.pooled = {n: AlphaEstimator(NGRAM_PRIOR_ALPHA) for n in range(1, ngram_size + 1)}
        self.by_position = {n: AcceptanceByPosition() for n in range(1, ngram_size + 1)}
        self.matched = 0  # the size of the last lookup's match (0: none)
        self._proposed, self._length, self._size = 0, 0, 0
        self._shadow: tuple[int, list[int], int] | None = None  # a lookup left: where, its tokens, its match size
        self._settled = dict.fromkeys(self.pooled, 0)  # by match size: lookups proposed or left, and settled
        # Where each n-gram of the text first ended, kept up as the text grows: a search of the whole
        # text at every step cost ~60 µs at 350 tokens (3 % of a 2 ms step of a small quantized target,
        # at every K=0 step where the hybrid looks up), and more the longer the text.
        self._first_end: dict[int, dict[tuple[int, ...], int]] = {}
        self._indexed = (0, None, None)  # the text the index covers: its length, first and last token

    def reset(self, seq: list[int]) -> None:
        self._first_end, self._indexed, self._shadow = {}, (0, None, None), None

    def propose(self, seq, k, sampling, rng, keep_drafting=None, grammar=None, probe=""):
        found = self.find(seq, k)
        self.note(seq, len(found))
        return found, None

    def lookup(self, seq: list[int], k: int, worth: LookupWorth) -> list[int]:
        """A step where the K policy chose K=0: as many of the lookup's tokens as `worth` (the K
        policy, which knows the verify batches' costs) says pay, given each one's acceptance."""
        found = self.find(seq, k)
        offered = self.worth_verifying(len(found))[0]
        # Before its first lookup of this size is settled only the prior speaks for it: one is verified
        # wherever a token is expected, as a draft probe would be. Priced at once, SmolLM2 quoting loses
        # the first span of each answer while the lookups it left are settled (1.12-1.14x, not 1.19-1.24x).
        priced = worth if self._settled[max(self.matched, 1)] else worth_a_token
        n = priced(self.alphas(offered)) if found else 0
        self.note(seq, n)
        if found and not n:
            self.shadow(seq, found[: max(offered, 1)])
        return found[:n]

    def shadow(self, seq: Sequence[int], tokens: list[int]) -> None:
        """A lookup of `tokens` after `seq` that this step does not propose: learn from how far the
        text goes on as it says (one at a time; a later one waits until this one is settled)."""
        if self._shadow is None and tokens:
            self._shadow = (len(seq), tokens, max(self.matched, 1))

    def find(self, seq: Sequence[int], k: int) -> list[int]:
        """Up to k tokens that followed the first earlier occurrence of the longest matching suffix
        (its size in `matched`)."""
        self._index(seq)
        for n in range(min(self.ngram_size, len(seq) - 1), self.min_size - 1, -1):
            end = self._first_end[n].get(tuple(seq[-n:]))
            if end is not None and end < len(seq):  # an occurrence before the text's own end
                self.matched = n
                return [int(t) for t in seq[end : end + k]]
        self.matched = 0
        return []

    def _index(self, seq: Sequence[int]) -> None:
        """Bring the first ends up to `seq`: only its new tokens, where it extends the text indexed
        (the loop's text only grows within a request), else all of it again."""
        done, first, last = self._indexed
        if done > len(seq) or (done and (seq[0] != first or seq[done - 1] != last)):
            self._first_end, done = {}, 0
        for n in range(self.min_size, self.ngram_size + 1):
            first_end = self._first_end.setdefault(n, {})
            for end in range(max(done + 1, n), len(seq) + 1):
                first_end.setdefault(tuple(seq[end - n : end]), end)
        self._indexed = (len(seq), seq[0], seq[-1]) if seq else (0, None, None)

    def alphas(self, n: int) -> list[float]:
        """Each position's acceptance for a lookup whose match is the size of the last one found."""
        size = max(self.matched, 1)
        return self.by_position[size].alphas(n, self.pooled[size].alpha)

    def worth_verifying(self, available: int) -> tuple[int, float]:
        """How much of a lookup of `available` tokens to propose (up to where all of it being accepted
        becomes less likely than NGRAM_SURVIVAL_FLOOR), and how many of those are expected accepted.

        Not priced here: at K=0 the K policy, which knows the verify batches' costs, says how much
        of it pays (KPolicy.lookup_worth); the hybrid takes it where it beats the draft's run."""
        survival, n, expected = 1.0, 0, 0.0
        for alpha in self.alphas(available):
            survival *= alpha
            if survival < NGRAM_SURVIVAL_FLOOR:
                break
            n, expected = n + 1, expected + survival
        return n, expected

    def note(self, seq: Sequence[int], n: int) -> None:
        """This step proposes n tokens of the last lookup after `seq` (accepted() learns from them)."""
        self._length, self._proposed, self._size = len(seq), n, max(self.matched, 1)

    def accepted(self, seq):
        if self._proposed:
            accepted = len(seq) - self._length - 1  # the target's own token follows the accepted drafts
            self._learn(self._size, self._proposed, accepted)
        self._proposed = 0
        if self._shadow is not None:
            start, tokens, size = self._shadow
            went_on = seq[start : start + len(tokens)]
            followed = common_prefix(went_on, tokens)
            if followed < len(went_on) or len(went_on) == len(tokens):  # parted from it, or followed all of it
                self._learn(size, len(tokens), followed)
                self._shadow = None

    def _learn(self, size: int, proposed: int, accepted: int) -> None:
        """A lookup of `proposed` tokens after a match of `size`, the first `accepted` of them accepted."""
        self.pooled[size].observe(proposed, accepted)
        self.by_position[size].observe(proposed, accepted)
        self._settled[size] += 1


class HybridProposer(Proposer):
    """The draft model and prompt lookup together (--draft MODEL --ngram). Each step the lookup's
    proposal, free to make, is taken when the tokens it is expected to get accepted (its own
    acceptance by position, learned from its earlier proposals) are at least the draft model's
    recent accepted run; else the draft model drafts. Where the answer copies its input (edits,
    quotes, RAG), long lookups win; elsewhere matches are short or miss and the draft model runs.

    The choice depends only on the text so far, so each step's proposal is an ordinary proposal and
    verification stays exact (greedy) or distribution-preserving (one-hot q for lookups). The draft
    model is not fed during lookup steps: it reads what it missed in one batch when it drafts again.
    `source` says who proposed the last step's tokens ("draft" or "ngram")."""

    def __init__(self, draft: Proposer, ngram: NgramProposer):
        self.draft, self.ngram = draft, ngram
        self.drafter = self.source = getattr(draft, "source", DRAFT)  # who drafts: a draft model, a head
        self.draft_run = 1.0  # accepted tokens per draft-model step, decayed
        self._length, self._drafted = 0, 0  # the last step's: the text's length, the draft model's tokens

    @property
    def catch_up(self) -> int | None:
        return getattr(self.draft, "catch_up", None)

    @catch_up.setter
    def catch_up(self, tokens: int | None) -> None:
        self.draft.catch_up = tokens

    def reset(self, seq: list[int]) -> None:
        self.draft.reset(seq)
        self.ngram.reset(seq)

    def read_steps(self, seq, end):
        return (yield from self.draft.read_steps(seq, end))

    def lookup(self, seq: list[int], k: int, worth: LookupWorth) -> list[int]:
        """A step where the K policy chose K=0 (the draft model does not pay): the lookup's, as
        NgramProposer.lookup decides."""
        self.source, self._length, self._drafted = NGRAM, len(seq), 0
        return self.ngram.lookup(seq, k, worth)

    def propose(self, seq, k, sampling, rng, keep_drafting=None, grammar=None, probe=""):
        return run_evals(self.propose_steps(seq, k, sampling, rng, keep_drafting, grammar, probe))

    def propose_steps(self, seq, k, sampling, rng, keep_drafting=None, grammar=None, probe=""):
        self._length = len(seq)
        lookup = self.ngram.find(seq, k)
        n, expected = self.ngram.worth_verifying(len(lookup))
        if n and expected >= self.draft_run:
            self.source, self._drafted = NGRAM, 0
            self.ngram.note(seq, n)
            return lookup[:n], None
        self.ngram.shadow(seq, lookup[: max(n, 1)])
        self.source = self.drafter
        tokens, q = yield from self.draft.propose_steps(seq, k, sampling, rng, keep_drafting, grammar, probe)
        self._drafted = len(tokens)
        return tokens, q

    def accepted(self, seq):
        if self.source == self.drafter and self._drafted:
            accepted = len(seq) - self._length - 1
            self.draft_run = DRAFT_RUN_DECAY * self.draft_run + (1 - DRAFT_RUN_DECAY) * accepted
        self.ngram.accepted(seq)
        self.draft.accepted(seq)
