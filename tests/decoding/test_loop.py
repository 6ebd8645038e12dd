"""The draft-verify loop on real llama.cpp inference with the synthetic tiny pair."""

import math
import tracemalloc

import numpy as np
import pytest

from ollama_spec.decoding.k_policy import PROBE_ACCEPTANCE, PROBE_COSTS
from ollama_spec.decoding.loop import SpeculationSettings, SpeculationStats, generate_tokens
from ollama_spec.decoding.sampling import SamplingSettings, logits_to_probs
from ollama_spec.engine.engine import NEAR_TIE_LOGITS, Engine, Request
from tests.conftest import engine_settings
from tests.distribution import assert_counts_follow
from tests.greedy import assert_greedy_identical

GREEDY = SamplingSettings(temperature=0)
PROMPTS = [
    "The quick brown fox",
    "Write a function that returns the sum",
    "What is the capital of France?",
    "Jelaskan arsitektur microservices vs monolith dan kapan harus migrasi.",
]


def request(prompt, **kwargs):
    return Request(prompt, **({"max_tokens": 48, "sampling": GREEDY} | kwargs))


def run(engine, prompt, **kwargs):
    generation = engine.generate(request(prompt, **kwargs))
    text = "".join(generation)
    assert text == generation.result.text
    return generation.result


def assert_same_greedy(reference_engine, prompt, expected, got, **kwargs):
    """Token identity up to the near-ties `bench` allows (tests/greedy.py); the first prompt's
    answer has one at its 43rd token (0.0023 logits) on the machine these tests were written on."""
    assert_greedy_identical(reference_engine, request(prompt, **kwargs), expected, got)


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_output_is_token_identical_to_target_alone(baseline_engine, spec_engine, prompt):
    expected = run(baseline_engine, prompt).tokens
    assert len(expected) > 10
    for k in range(1, 9):
        result = run(spec_engine, prompt, speculation=SpeculationSettings(k))
        assert_same_greedy(baseline_engine, prompt, expected, result.tokens)
        assert result.speculation.drafted > 0


def test_raw_prompts_too(baseline_engine, spec_engine):
    expected = run(baseline_engine, "Once upon a time", raw=True, max_tokens=64).tokens
    for k in (1, 4, 8):
        got = run(spec_engine, "Once upon a time", raw=True, max_tokens=64, speculation=SpeculationSettings(k)).tokens
        assert_same_greedy(baseline_engine, "Once upon a time", expected, got, raw=True, max_tokens=64)


def _runner_up_swapped(engine, prompt, pick):
    """The target's greedy answer with the token at margins' position `pick` replaced by its runner-up."""
    expected = run(engine, prompt).tokens
    prompt_tokens = engine.prompt_tokens(request(prompt))
    margins = engine.greedy_margins(prompt_tokens, expected)
    at = int(pick(margins))
    engine.target.truncate(0)
    runner_up = int(np.argsort(engine.target.eval(prompt_tokens + expected[:at])[-1])[-2])
    return expected, expected[:at] + [runner_up] + expected[at + 1 :], at, margins[at]


def test_the_near_tie_rule_refuses_a_real_difference_and_allows_a_tie(baseline_engine):
    expected, swapped, at, margin = _runner_up_swapped(baseline_engine, PROMPTS[1], np.argmax)
    assert margin > 10 * NEAR_TIE_LOGITS
    with pytest.raises(AssertionError, match=f"differ at token {at} of 48"):
        assert_same_greedy(baseline_engine, PROMPTS[1], expected, swapped)
    expected, swapped, at, margin = _runner_up_swapped(baseline_engine, PROMPTS[0], np.argmin)
    if margin < NEAR_TIE_LOGITS:  # true here (0.0023); another CPU's answer may hold no tie
        assert_same_greedy(baseline_engine, PROMPTS[0], expected, swapped)


@pytest.fixture(scope="module")
def self_drafting_engine(tiny_models):
    with Engine(tiny_models[0], tiny_models[0], engine_settings()) as engine:
        yield engine


# Sampling without top-k/top-p cuts: a token on the edge of a cut could fall inside q's set and
# outside p's when a single token and a batch round differently, and be rejected.
@pytest.mark.parametrize("sampling", [GREEDY, SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, seed=5)])
def test_draft_equal_to_target_accepts_every_token(self_drafting_engine, sampling):
    # This prompt's greedy answer has no near-tie in its first 190 tokens (smallest margin 0.04):
    # at a near-tie a single-token and a batched evaluation could disagree and reject.
    result = run(self_drafting_engine, PROMPTS[1], max_tokens=60, sampling=sampling, ignore_eos=True)
    stats = result.speculation
    assert stats.drafted >= 45  # 60 tokens: every step drafts up to K=4 and adds one token
    assert stats.accepted == stats.drafted


def test_stats_add_up(spec_engine):
    stats = run(
        spec_engine, PROMPTS[1], max_tokens=100, ignore_eos=True, speculation=SpeculationSettings(4)
    ).speculation
    assert stats.generated >= 100
    assert stats.generated == stats.accepted + stats.steps
    assert sum(stats.drafted_by_position) == stats.drafted and sum(stats.accepted_by_position) == stats.accepted
    # every step drafts at least one token, but the first: the prompt's own pass gives the first token
    assert stats.drafted_by_position[0] == stats.steps - 1
    assert 0 < stats.acceptance_rate < 1


def first_two_tokens(target, draft, prompt, sampling, seed, speculation, policy=None):
    tokens = generate_tokens(
        target, draft, prompt, SamplingSettings(**(vars(sampling) | {"seed": seed})), speculation, policy=policy
    )
    pair = (next(tokens).id, next(tokens).id)
    tokens.close()
    return pair


def assert_first_two_tokens_follow_the_target(
    target, draft, sampling, speculation, prompt="Once upon a time", policy=lambda: None
):
    """Chi-square test of the first two tokens against the exact target distribution.

    3,000 seeded runs; cells expected fewer than 5 times are pooled; significance 0.001 (a
    correct implementation fails one seed set in a thousand, and the seeds are fixed).
    """
    prompt = target.tokenize(prompt, add_bos=True, special=False)
    exact = {}
    target.truncate(0)
    first = logits_to_probs(target.eval(prompt)[-1], sampling)
    for t1 in np.flatnonzero(first):
        target.truncate(len(prompt))
        second = logits_to_probs(target.eval([int(t1)])[-1], sampling)
        for t2 in np.flatnonzero(second):
            exact[(int(t1), int(t2))] = first[t1] * second[t2]
    n = 3000
    counts = dict.fromkeys(exact, 0)
    for seed in range(n):
        counts[first_two_tokens(target, draft, prompt, sampling, seed, speculation, policy())] += 1
    assert_counts_follow(exact, counts)
    return exact


def test_rejection_sampling_preserves_the_target_distribution(spec_engine):
    """top-k 4 keeps 16 possible (t1, t2) pairs."""
    sampling = SamplingSettings(temperature=1.0, top_k=4, top_p=1.0)
    assert_first_two_tokens_follow_the_target(spec_engine.target, spec_engine.draft, sampling, SpeculationSettings(2))


def test_draft_p_min_keeps_the_target_distribution(spec_engine):
    """Stopping early must be decided before the draft samples: a rule that looks at the
    sampled token's probability keeps tokens from a truncated q (issue: 0.55 instead of 0.5)."""
    sampling = SamplingSettings(temperature=1.5, top_k=6, top_p=1.0)
    assert_first_two_tokens_follow_the_target(
        spec_engine.target, spec_engine.draft, sampling, SpeculationSettings(2, draft_p_min=0.5)
    )


class MarginRule:
    """Drafts a second token only where the draft's margin for it is wide: a stop that depends on
    the prefix drawn so far, as AutoK's confidence stops do."""

    probing = ""

    def __init__(self, log):
        self.log = log

    def next_k(self):
        return 2

    def keep_drafting(self, drafted, margin):
        if margin is None:  # asked before the draft step that shows the next token
            return True
        keep = drafted == 0 or margin > 0.15
        if drafted:
            self.log.append(keep)
        return keep

    def observe(self, *args, **kwargs):
        pass


class ProbesAfterGaps:
    """K=0 for 20 steps, a one-token probe, then three steps drafting 3: the windowed probe's read
    and the full catch-up after it, again and again; the probes ask for the costs and for the
    acceptance in turn (the first, of a draft that has read nothing, a window after BOS)."""

    keep_drafting = None
    quiet_steps = 0

    def __init__(self):
        self.step, self.probing = 0, ""

    def next_k(self):
        phase, cycle, self.step = self.step % 24, self.step // 24, self.step + 1
        self.probing = "" if phase != 20 else PROBE_COSTS if cycle % 2 == 0 else PROBE_ACCEPTANCE
        return 0 if phase < 20 else 1 if self.probing else 3

    def lookup_worth(self, alphas):  # KPolicy's: the loop offers it at K=0; a draft model looks nothing up
        return 0

    def observe(self, drafted, accepted, draft_s, verify_s, *, lookup=False):
        pass


@pytest.mark.parametrize("sampling", [GREEDY, SamplingSettings(temperature=0.8, seed=3)])
def test_probes_after_long_gaps_leave_the_output_unchanged(baseline_engine, spec_engine, sampling):
    """A probe reads only the end of what the draft missed and cuts it off again: the text is the
    target's all the same (greedy: token for token; seeded sampling: the verify draws differ, so
    only the greedy text is compared, and sampling must simply run)."""
    prompt = spec_engine.prompt_tokens(request(PROMPTS[1]))
    stats = SpeculationStats()
    tokens = generate_tokens(
        spec_engine.target, spec_engine.draft, prompt, sampling, SpeculationSettings(None), stats, ProbesAfterGaps()
    )
    got = [next(tokens).id for _ in range(100)]
    tokens.close()
    assert stats.k_chosen.get(1, 0) >= 3 and stats.k_chosen.get(3, 0) >= 3
    if sampling.greedy:
        expected = run(baseline_engine, PROMPTS[1], max_tokens=100, ignore_eos=True).tokens
        assert_same_greedy(baseline_engine, PROMPTS[1], expected, got, max_tokens=100, ignore_eos=True)


def test_stopping_by_margin_keeps_the_target_distribution(spec_engine):
    sampling = SamplingSettings(temperature=1.0, top_k=4, top_p=1.0)
    log = []
    assert_first_two_tokens_follow_the_target(
        spec_engine.target, spec_engine.draft, sampling, SpeculationSettings(None), policy=lambda: MarginRule(log)
    )
    assert 0.1 < np.mean(log) < 0.9  # both ways, often


def test_rejection_sampling_accepts_more_than_sample_and_compare(spec_engine):
    """Same real draft/target distributions, two lossless rules: Σmin(p,q) vs Σp·q per position."""
    from ollama_spec.decoding.verify import verify_rejection, verify_sample_and_compare

    target, draft = spec_engine.target, spec_engine.draft
    sampling = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0)
    rng = np.random.default_rng(0)
    seq = target.tokenize(PROMPTS[3], add_bos=True, special=False)
    target.truncate(0)
    draft.truncate(0)
    p_rows = target.eval(seq, logits="all")[-1:]
    q_rows = draft.eval(seq, logits="all")[-1:]
    rejection = compare = 0
    trials = 0
    for _ in range(40):  # walk 40 positions of the target's own text
        p, q = logits_to_probs(p_rows[-1], sampling), logits_to_probs(q_rows[-1], sampling)
        for _ in range(50):
            x = int(rng.choice(len(q), p=q))
            rejection += verify_rejection([x], q[None], np.stack([p, p]), rng)[0]
            compare += verify_sample_and_compare([x], np.stack([p, p]), rng)[0]
            trials += 1
        token = int(rng.choice(len(p), p=p))
        p_rows, q_rows = target.eval([token]), draft.eval([token])
    assert rejection / trials > compare / trials + 0.05


def test_long_generation_keeps_memory_bounded(tiny_models, monkeypatch):
    """2,100 tokens with a draft: no error, logits copied only for the verify rows, and nothing kept
    per token but the token itself.

    Memory is counted with tracemalloc (every Python object and numpy buffer, byte for byte)
    rather than RSS, which moves with the allocator's arenas and the kernel's paging. Keeping one
    512-wide row of float32 logits per token would hold 4.3 MB at the end; the 2,100 token ids
    in the result (the one thing that must grow) take about 80 KB.
    """
    from ollama_spec.llama import model as runtime

    rows_read = []
    real_read = runtime.LoadedModel._read_logits
    monkeypatch.setattr(runtime.LoadedModel, "_read_logits", lambda self, n: rows_read.append(n) or real_read(self, n))
    with Engine(tiny_models[0], tiny_models[1], engine_settings(n_ctx=4096)) as engine:
        run(engine, PROMPTS[0], max_tokens=50, ignore_eos=True)  # warm up caches and lazy imports
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            generation = engine.generate(
                request(PROMPTS[0], max_tokens=2100, ignore_eos=True, speculation=SpeculationSettings(5))
            )
            for _ in generation:
                pass
            held, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
    result = generation.result
    assert len(result.tokens) == 2100 and result.finish_reason == "length"
    assert max(rows_read) <= 6  # never more than K + 1 rows of logits
    assert held - before < 1 << 20 and peak - before < 2 << 20, (held - before, peak - before)


def test_stop_string_ends_generation_and_is_not_printed(baseline_engine, spec_engine):
    full = run(baseline_engine, PROMPTS[0], max_tokens=40).text
    stop = full[12:16]
    for engine in (baseline_engine, spec_engine):
        result = run(engine, PROMPTS[0], max_tokens=40, stop=(stop,))
        assert result.finish_reason == "stop"
        assert result.text == full[: full.index(stop)]


def test_end_of_turn_token_ends_generation(baseline_engine, spec_engine):
    # The synthetic models end their turn after a period; this prompt's answer ends after 45 tokens,
    # every one of them (and the end of turn) chosen by a clear margin (0.07 logits or more).
    prompt = "brown mat is dot jumps?"
    base = run(baseline_engine, prompt, raw=True, max_tokens=200)
    assert base.finish_reason == "stop" and len(base.tokens) < 200
    info = baseline_engine.target_model.info
    ignored = run(baseline_engine, prompt, raw=True, max_tokens=len(base.tokens) + 1, ignore_eos=True)
    assert ignored.tokens[len(base.tokens)] in (info.eos_id, info.eot_id)  # the next token ended the turn
    assert run(spec_engine, prompt, raw=True, max_tokens=200).tokens == base.tokens


def test_max_tokens(spec_engine):
    result = run(spec_engine, PROMPTS[1], max_tokens=7, ignore_eos=True, speculation=SpeculationSettings(5))
    assert len(result.tokens) == 7 and result.finish_reason == "length"


@pytest.mark.parametrize("max_tokens", [1, 2, 7, 30])
def test_no_step_drafts_past_max_tokens(spec_engine, max_tokens):
    """A step emits its accepted drafts and one token more, so no verify row may be for a place past
    the answer's last token: drafting and verifying it would be work thrown away."""
    result = run(
        spec_engine,
        PROMPTS[1],
        max_tokens=max_tokens,
        ignore_eos=True,
        speculation=SpeculationSettings(5),
        trace_batches=True,
    )
    assert len(result.tokens) == max_tokens
    batches = result.speculation.batches
    # a batch reading positions [first, first + n) has rows for the tokens at first + 1 .. first + n
    assert max(first + n for first, n in batches) <= result.prompt_tokens + max_tokens - 1
    assert any(n > 1 for _, n in batches[1:]) or max_tokens <= 2  # it still drafts where there is room


def test_context_full_stops_cleanly(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings(n_ctx=64)) as engine:
        result = run(engine, PROMPTS[0], max_tokens=500, ignore_eos=True)
        n_ctx = engine.target.n_ctx  # llama.cpp rounds the context up to its padding
    with Engine(tiny_models[0], None, engine_settings(n_ctx=64)) as baseline:
        expected = run(baseline, PROMPTS[0], max_tokens=500, ignore_eos=True)
        # 230 tokens, with near-ties of 0.0005 logits at this context size
        assert_same_greedy(baseline, PROMPTS[0], expected.tokens, result.tokens, max_tokens=500, ignore_eos=True)
    assert result.finish_reason == "context" and expected.finish_reason == "context"
    assert result.prompt_tokens + len(result.tokens) == n_ctx + 1  # the last one is predicted from a full cache


def test_prompt_longer_than_context_is_refused(tiny_models):
    from ollama_spec.errors import InvalidSetting

    with Engine(tiny_models[0], None, engine_settings(n_ctx=16)) as engine:
        # llama.cpp pads its cache to 256 tokens at least; the limit asked for is the one kept
        assert engine.target.n_ctx == 16
        with pytest.raises(InvalidSetting, match=r"the prompt is \d+ tokens but the context holds 16; raise --ctx"):
            run(engine, PROMPTS[3] * 20)


def test_adaptive_drafting_stops_early_and_stays_exact(baseline_engine, tiny_models):
    expected = run(baseline_engine, PROMPTS[1], max_tokens=60).tokens
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        result = run(engine, PROMPTS[1], max_tokens=60, speculation=SpeculationSettings(8, draft_p_min=0.9))
    assert_same_greedy(baseline_engine, PROMPTS[1], expected, result.tokens, max_tokens=60)
    assert result.speculation.drafted < 8 * result.speculation.steps


def test_the_first_token_comes_from_the_prompts_own_pass(spec_engine, monkeypatch):
    """A streamed answer starts as soon as the target has read the prompt, as with the target alone:
    nothing is drafted or verified before the first token (its row is the prompt batch's last)."""
    target, draft = spec_engine.target, spec_engine.draft
    spec_engine.clear_cache()
    prompt = target.tokenize("Once upon a time", add_bos=True, special=False)
    batches = []
    real_eval = target.eval
    monkeypatch.setattr(target, "eval", lambda tokens, **kw: batches.append(len(tokens)) or real_eval(tokens, **kw))
    tokens = generate_tokens(target, draft, prompt, GREEDY, SpeculationSettings(4))
    next(tokens)
    assert batches == [len(prompt)] and draft.n_past == 0
    assert target.n_past == len(prompt)
    next(tokens)  # then the steps draft: the draft reads the prompt and the first token
    tokens.close()
    assert draft.n_past >= len(prompt) + 1 and batches[1] > 1
    spec_engine.clear_cache()
    alone = run(spec_engine, "Once upon a time", max_tokens=1, speculation=SpeculationSettings(4))
    assert alone.speculation.drafted == 0  # one token asked for: nothing is drafted at all


def test_stats_object_is_optional(spec_engine):
    target, draft = spec_engine.target, spec_engine.draft
    prompt = target.tokenize("Hi", add_bos=True, special=False)

    def first_ten(*stats):
        tokens = generate_tokens(target, draft, prompt, GREEDY, SpeculationSettings(3), *stats)
        ids = [next(tokens).id for _ in range(10)]
        tokens.close()
        return ids

    stats = SpeculationStats()
    counted = first_ten(stats)
    assert stats.generated >= 10
    assert first_ten() == counted and first_ten(None) == counted  # the same tokens without a stats object


class FixedDistributionModel:
    """A two-token model whose next-token logits never change: the issue's worked example."""

    n_ctx = 1 << 20

    def __init__(self, probs):
        self.logits = np.log(np.asarray(probs, dtype=np.float32))
        self.n_vocab = len(probs)
        self.cached = []

    @property
    def n_past(self):
        return len(self.cached)

    def eval(self, tokens, *, logits="last"):
        self.cached += tokens
        rows = len(tokens) if logits == "all" else 1 if logits == "last" else logits
        return np.tile(self.logits, (rows, 1))

    def truncate(self, n_tokens):
        del self.cached[n_tokens:]


def test_draft_p_min_decides_before_sampling():
    """p = (.5, .5), q = (.9, .1), p_min = .5: the second token must still be 0 half the time.

    Keeping a drafted token only when q(token) >= p_min gave 0.55 (30,000 runs: 0.5505 ± 0.0037).
    """
    sampling = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0)
    target, draft = FixedDistributionModel([0.5, 0.5]), FixedDistributionModel([0.9, 0.1])
    n = 20000
    seconds = [
        first_two_tokens(target, draft, [0], sampling, seed, SpeculationSettings(2, draft_p_min=0.5))[1]
        for seed in range(n)
    ]
    share = seconds.count(0) / n
    assert abs(share - 0.5) < 4.5 * 0.5 / np.sqrt(n), share


@pytest.mark.parametrize("prompt", PROMPTS[:2])
def test_padded_target_vocabulary_greedy_is_token_identical(padded_engine, prompt):
    assert padded_engine.target.n_vocab == padded_engine.draft.n_vocab + 64
    expected = run(padded_engine, prompt, max_tokens=40, ignore_eos=True)
    alone = padded_engine.generate(request(prompt, max_tokens=40, ignore_eos=True), use_draft=False)
    "".join(alone)
    assert_same_greedy(padded_engine, prompt, alone.result.tokens, expected.tokens, max_tokens=40, ignore_eos=True)
    for k in (1, 3, 8):
        got = run(padded_engine, prompt, max_tokens=40, ignore_eos=True, speculation=SpeculationSettings(k)).tokens
        assert_same_greedy(padded_engine, prompt, alone.result.tokens, got, max_tokens=40, ignore_eos=True)


def test_padded_target_samples_ids_the_draft_lacks_without_failing(padded_engine):
    """The target emits padding ids; the draft reads a stand-in and keeps drafting."""
    sampling = SamplingSettings(temperature=1.0, top_k=0, top_p=1.0, seed=1)
    result = run(padded_engine, PROMPTS[0], max_tokens=300, ignore_eos=True, sampling=sampling)
    assert len(result.tokens) == 300
    assert any(token >= padded_engine.draft.n_vocab for token in result.tokens)
    assert result.speculation.accepted > 0


def test_padded_target_keeps_its_distribution(padded_engine):
    """Rejections subtract a 512-wide q from a 576-wide p: q is 0 on the target's extra ids."""
    sampling = SamplingSettings(temperature=1.0, top_k=6, top_p=1.0)
    exact = assert_first_two_tokens_follow_the_target(
        padded_engine.target, padded_engine.draft, sampling, SpeculationSettings(2)
    )
    assert any(t1 >= padded_engine.draft.n_vocab or t2 >= padded_engine.draft.n_vocab for t1, t2 in exact)


def test_a_cache_that_cannot_be_cut_raises(spec_engine, monkeypatch):
    """Recurrent caches refuse a partial cut (llama.cpp returns false); going on would be wrong."""
    from ollama_spec.errors import InferenceError
    from ollama_spec.llama import model as runtime

    monkeypatch.setattr(runtime.llama_cpp, "llama_memory_seq_rm", lambda *args: False)
    with pytest.raises(InferenceError, match="cannot cut the cache"):
        run(spec_engine, PROMPTS[0], max_tokens=40, ignore_eos=True)


def test_auto_k_is_exact_reports_its_choices_and_calibrates_once_per_pair(
    tiny_models, baseline_engine, monkeypatch, own_cache
):
    from ollama_spec.engine import costs as engine_module

    calibrations = []
    real = engine_module.measure_step_costs
    monkeypatch.setattr(engine_module, "measure_step_costs", lambda *a, **k: calibrations.append(1) or real(*a, **k))
    # kept however the passes compare with it: on a loaded machine they may find it too dear, and the
    # next engine would time the steps again (test_costs.py)
    monkeypatch.setattr(engine_module, "CALIBRATION_AT_MOST", math.inf)
    expected = run(baseline_engine, PROMPTS[1], max_tokens=60).tokens
    auto = SpeculationSettings(None)
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        result = run(engine, PROMPTS[1], max_tokens=60, speculation=auto)
        run(engine, PROMPTS[0], max_tokens=20, speculation=auto)
    assert result.tokens == expected
    stats = result.speculation
    # every step but the prompt's own pass (which drafts nothing, by design) is a choice of K
    assert sum(stats.k_chosen.values()) == stats.steps - 1 and max(stats.k_chosen) <= auto.max_speculative_tokens
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:  # measured costs are cached on disk
        run(engine, PROMPTS[1], max_tokens=20, speculation=auto)
    assert calibrations == [1]
