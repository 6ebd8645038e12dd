"""Learned K costs (-k auto): calibrated once, refined by each request, kept for the next process."""

import pytest

from ollama_spec.decoding.loop import DEFAULT_MAX_SPECULATIVE_TOKENS, SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.costs import CHECK_EVERY_PASSES
from ollama_spec.engine.engine import Engine, Request
from tests.conftest import engine_settings

GREEDY = SamplingSettings(temperature=0)


def test_costs_learned_in_one_request_seed_the_next_and_the_cache(tiny_models, tmp_path, monkeypatch):
    from ollama_spec.decoding.k_policy import AutoK
    from ollama_spec.decoding.step_costs import StepCosts
    from ollama_spec.engine.calibration import StepCostCache
    from tests.engine.test_step_loop import PassClock

    request = Request(
        "The quick brown fox", max_tokens=40, sampling=GREEDY, ignore_eos=True, speculation=SpeculationSettings(None)
    )  # -k auto
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        engine.costs.cache = cache = StepCostCache(tmp_path / "costs.json")
        key = engine.costs.key(engine.draft)
        # the passes take 0.1 ms a draft token and 1.2 ms + 0.05 ms a token a verify (PassClock); a
        # calibration half again as dear is no busy one's (it stays), but learning must move off it
        PassClock(engine, monkeypatch, draft_python_s=0.0)
        calibration = StepCosts(
            0.00015, tuple(1.5 * (0.0012 + 0.00005 * (n + 1)) for n in range(DEFAULT_MAX_SPECULATIVE_TOKENS + 1))
        )
        cache.put(key, calibration)
        "".join(engine.generate(request))
        first = engine.costs.step_costs(engine.draft, DEFAULT_MAX_SPECULATIVE_TOKENS)
        assert first.verify_s[0] == pytest.approx(0.00125, rel=0.05)  # as the request's passes took, not 1.9 ms
        policy = engine.costs.k_policy(request.speculation, GREEDY)
        # the next request starts from what the last one learned (its passes' costs, as AutoK's line)
        assert policy.costs.verify_s == pytest.approx(AutoK(first).costs.verify_s)
    assert cache.get_learned(key).verify_s == pytest.approx(first.verify_s)  # and so does the next process
    assert cache.get(key) == calibration  # beside the calibration, which keeps its own per-size costs


def test_acceptance_by_margin_learned_in_one_process_seeds_the_next(tiny_models, tmp_path, monkeypatch):
    from ollama_spec.decoding.acceptance import MARGIN_PRIOR
    from ollama_spec.decoding.step_costs import StepCosts
    from ollama_spec.engine.calibration import StepCostCache
    from tests.engine.test_step_loop import PassClock

    request = Request(
        "The quick brown fox", max_tokens=40, sampling=GREEDY, ignore_eos=True, speculation=SpeculationSettings(None)
    )
    cache = StepCostCache(tmp_path / "costs.json")
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        engine.costs.cache = cache
        key = engine.costs.key(engine.draft)
        # passes timed as a draft step that costs a tenth of a verify (PassClock), and a calibration that
        # agrees, so that the request drafts whatever this CPU's timings would say: where no acceptance
        # pays, the probes do not learn the draft's margins (a guess from the text's end); a draft step
        # of 1 ms, dear enough to weigh each token by its margin (k_tuning.STOPS_MIN_DRAFT_S)
        PassClock(engine, monkeypatch, draft_python_s=0.0, scale=10)
        cache.put(key, StepCosts(0.001, tuple(0.012 + 0.0005 * n for n in range(DEFAULT_MAX_SPECULATIVE_TOKENS + 1))))
        assert engine.costs.k_policy(request.speculation, GREEDY).by_margin.bands == pytest.approx(MARGIN_PRIOR)
        "".join(engine.generate(request))
        learned = engine.costs.last_policies[key].by_margin.bands
        assert learned != pytest.approx(MARGIN_PRIOR)
    assert cache.get_acceptance(key) == pytest.approx(learned, abs=1e-4)
    assert cache.get(key) is not None  # the costs stay beside it
    monkeypatch.undo()
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        engine.costs.cache = cache
        assert engine.costs.k_policy(request.speculation, GREEDY).by_margin.bands == pytest.approx(learned, abs=1e-4)
        seeded = SamplingSettings(temperature=0.8, seed=1)  # its text must not depend on an earlier run
        assert engine.costs.k_policy(request.speculation, seeded).by_margin.bands == pytest.approx(MARGIN_PRIOR)


def test_a_calibration_is_announced_while_it_happens(tiny_models, tmp_path):
    from ollama_spec.engine.calibration import StepCostCache

    notes = []
    with Engine(tiny_models[0], tiny_models[1], engine_settings(), notice=notes.append) as engine:
        engine.costs.cache = StepCostCache(tmp_path / "costs.json")
        engine.costs.k_policy(SpeculationSettings(None), GREEDY)
        engine.costs.k_policy(SpeculationSettings(None), GREEDY)  # measured once: no second note
    assert len(notes) == 1 and "-k auto" in notes[0]


def test_a_long_calibration_says_how_far_it_is_and_when_it_is_done(tiny_models, tmp_path, monkeypatch):
    """Issue 42: a 0.6B pair's calibration takes 40 s to minutes; it reports every NOTICE_EVERY_S (here
    every step) through the engine's notice, counting the steps, and says when it is over."""
    from ollama_spec.engine import costs as costs_module
    from ollama_spec.engine.calibration import CALIBRATION_REPEATS, StepCostCache, batch_sizes_to_time

    monkeypatch.setattr(costs_module, "NOTICE_EVERY_S", 0.0)
    notes = []
    with Engine(tiny_models[0], tiny_models[1], engine_settings(), notice=notes.append) as engine:
        engine.costs.cache = StepCostCache(tmp_path / "costs.json")
        engine.costs.prepare(SpeculationSettings(None))
    steps = CALIBRATION_REPEATS * (1 + len(batch_sizes_to_time(DEFAULT_MAX_SPECULATIVE_TOKENS + 1)))
    assert notes[0].startswith("timing this machine's draft and verify steps for -k auto (")
    counts = [note.rsplit(", ", 1)[0] for note in notes[1:-1]]
    assert counts == [f"timing steps for -k auto: {n} of {steps}" for n in range(1, steps + 1)]
    assert notes[-1].startswith("timed this machine's steps for -k auto in ")


def test_prepare_times_the_steps_before_any_request(tiny_models, tmp_path, monkeypatch):
    """serve calls it while loading: the first request then measures nothing (and no timing runs
    while other slots' batches do)."""
    from ollama_spec.engine import costs as costs_module
    from ollama_spec.engine.calibration import StepCostCache

    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        engine.costs.cache = StepCostCache(tmp_path / "costs.json")
        engine.costs.prepare(SpeculationSettings(3))  # a fixed K needs no timing
        assert engine.costs.cache.get(engine.costs.key(engine.draft)) is None
        engine.costs.prepare(SpeculationSettings(None))
        assert engine.costs.cache.get(engine.costs.key(engine.draft)) is not None

        def measured_again(*args, **kwargs):
            raise AssertionError("the first request timed the steps again")

        monkeypatch.setattr(costs_module, "measure_step_costs", measured_again)
        request = Request("Hi", raw=True, max_tokens=8, sampling=GREEDY, speculation=SpeculationSettings(None))
        "".join(engine.generate(request))


def test_a_model_served_without_a_draft_times_nothing(tiny_models, tmp_path, monkeypatch):
    """With no draft loaded, -k auto has nothing to draft with: a fresh cache stays empty at load and
    after a request, and no draft or verify step is timed."""
    from ollama_spec.engine import costs as costs_module
    from ollama_spec.engine.calibration import StepCostCache

    timed = []
    monkeypatch.setattr(costs_module, "measure_step_costs", lambda *args, **kwargs: timed.append(args))
    with Engine(tiny_models[0], None, engine_settings()) as engine:
        engine.costs.cache = cache = StepCostCache(tmp_path / "costs.json")
        engine.costs.prepare(SpeculationSettings(None))  # as serve and the scheduler do while loading
        request = Request("Hi", raw=True, max_tokens=8, sampling=GREEDY, speculation=SpeculationSettings(None))
        assert len("".join(engine.generate(request))) > 0
    assert timed == [] and cache.get(engine.costs.key(None)) is None


def test_requests_that_shared_their_batches_keep_their_costs_to_themselves(tiny_models, tmp_path):
    """Beside another slot a request's steps are timed whole, the other's part too: not a lone
    request's costs, so they are not kept."""
    from ollama_spec.engine.calibration import StepCostCache
    from ollama_spec.engine.sinks import stream

    request = Request(
        "The quick brown fox", max_tokens=40, sampling=GREEDY, ignore_eos=True, speculation=SpeculationSettings(None)
    )
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=2, n_ctx=512)) as engine:
        engine.costs.cache = cache = StepCostCache(tmp_path / "costs.json")
        key = engine.costs.key(engine.draft)
        engine.costs.prepare(request.speculation)
        with engine.loop.together():  # admitted at the same turn: their steps share every pass
            running = [stream(engine.loop, request, engine.prompt_tokens(request)) for _ in range(2)]
        for _, pieces in running:
            "".join(pieces)
        assert key in engine.costs.last_policies  # what they learned of the acceptance carries
        assert key not in engine.costs.learned
        "".join(engine.generate(request))  # alone, its costs are the pair's
        assert key in engine.costs.learned
    assert cache.get_learned(key) is not None


def test_learned_costs_far_dearer_than_the_calibration_are_set_aside(tiny_models, tmp_path):
    """A cache whose learned verify batches are many times the timed ones (learned from batches shared
    with other slots, by an older version) does not seed the next request."""
    from ollama_spec.decoding.step_costs import StepCosts
    from ollama_spec.engine.calibration import StepCostCache

    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        engine.costs.cache = cache = StepCostCache(tmp_path / "costs.json")
        key, n = engine.costs.key(engine.draft), DEFAULT_MAX_SPECULATIVE_TOKENS + 1
        cache.put(key, StepCosts(0.001, tuple(0.01 + 0.001 * i for i in range(n))))
        cache.put_learned(key, StepCosts(0.001, (0.05, *(0.2 + 0.001 * i for i in range(1, n)))))
        assert engine.costs.step_costs(engine.draft, n - 1).verify_s[1] == pytest.approx(0.011)
        cache.put_learned(key, StepCosts(0.001, tuple(0.012 + 0.001 * i for i in range(n))))  # plausible: kept
        assert engine.costs.step_costs(engine.draft, n - 1).verify_s[1] == pytest.approx(0.013)


def _quiet_and_busy(n: int):
    from ollama_spec.decoding.step_costs import StepCosts

    quiet = StepCosts(0.004, tuple(0.030 + 0.007 * i for i in range(n)))
    # timed while a process spun beside it: every pass three times dearer, the draft's step ten, and a
    # batch of 8 tokens twice its neighbours
    busy = StepCosts(0.040, tuple(3 * t * (2 if i == 7 else 1) for i, t in enumerate(quiet.verify_s)))
    return quiet, busy


def _passes_ran(engine, costs, sizes=(1, 2, 3, 5)) -> None:
    """The step loop's passes, as if timed at `costs` (target passes of these sizes, a one-row draft pass)."""
    for size in sizes:
        engine.costs.passes.observe(False, size, costs.verify_s[size - 1])
        engine.costs.passes.observe(True, 1, costs.draft_step_s)


def test_a_calibration_taken_while_busy_gives_way_to_the_passes_and_is_timed_again(tiny_models, tmp_path, monkeypatch):
    """Once the loop's passes (the machine quiet again) find the calibration three times too dear, the
    next request starts from what they priced, a size they have not run is not priced by the
    calibration's busy bumps, the cache forgets it when the engine closes (what was learned of the
    acceptance stays), and the next process times the steps again rather than start from slow costs."""
    from ollama_spec.engine import costs as costs_module
    from ollama_spec.engine.calibration import StepCostCache

    quiet, busy = _quiet_and_busy(DEFAULT_MAX_SPECULATIVE_TOKENS + 1)
    bands = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
    cache = StepCostCache(tmp_path / "costs.json")
    auto = SpeculationSettings(None)
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        engine.costs.cache = cache
        key = engine.costs.key(engine.draft)
        cache.put(key, busy)
        cache.put_learned(key, busy)  # a run learned beside it while the machine stayed busy
        cache.put_acceptance(key, bands)
        assert engine.costs.k_policy(auto, GREEDY).costs.draft_step_s == busy.draft_step_s  # nothing run yet
        _passes_ran(engine, quiet)
        policy = engine.costs.k_policy(auto, GREEDY)
        assert policy.costs.draft_step_s == pytest.approx(quiet.draft_step_s)
        # the passes' prices, a line through the sizes run (not their busy level, three times these)
        assert policy.costs.verify_s[0] == pytest.approx(quiet.verify_s[0], rel=0.25)
        prices = engine.costs.passes
        assert prices.step_costs(2).verify_s == pytest.approx(quiet.verify_s[:3], rel=0.25)
        assert prices.target_pass(8) < min(1.3 * quiet.verify_s[7], prices.target_pass(9))
    assert cache.get(key) is None
    assert cache.get_acceptance(key) == bands
    timed = []
    monkeypatch.setattr(costs_module, "measure_step_costs", lambda *args, **kwargs: timed.append(1) or quiet)
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        engine.costs.cache = cache
        engine.costs.prepare(auto)
    assert timed == [1] and cache.get(key) == quiet and cache.get_learned(key) is None


def test_a_calibration_whose_draft_step_alone_was_timed_busy_is_not_kept_either(tiny_models, tmp_path):
    """A busy moment weighs most on the smallest passes: the draft's step."""
    from ollama_spec.decoding.step_costs import StepCosts
    from ollama_spec.engine.calibration import StepCostCache

    quiet, _ = _quiet_and_busy(DEFAULT_MAX_SPECULATIVE_TOKENS + 1)
    cache = StepCostCache(tmp_path / "costs.json")
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        engine.costs.cache = cache
        key = engine.costs.key(engine.draft)
        cache.put(key, StepCosts(10 * quiet.draft_step_s, quiet.verify_s))
        engine.costs.k_policy(SpeculationSettings(None), GREEDY)
        _passes_ran(engine, quiet)
    assert cache.get(key) is None


@pytest.mark.parametrize("level", [0.6, 1.0, 1.3, 3.0])
def test_a_calibration_the_passes_agree_with_or_find_cheap_is_kept(tiny_models, tmp_path, level):
    """Passes cheaper than the calibration by what reading at other depths explains, as dear, or dearer
    (the machine busy now, not then): the passes keep pricing from it, and the cache keeps it."""
    from ollama_spec.decoding.step_costs import StepCosts
    from ollama_spec.engine.calibration import StepCostCache

    quiet, _ = _quiet_and_busy(DEFAULT_MAX_SPECULATIVE_TOKENS + 1)
    passes = StepCosts(level * quiet.draft_step_s, tuple(level * t for t in quiet.verify_s))
    cache = StepCostCache(tmp_path / "costs.json")
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        engine.costs.cache = cache
        key = engine.costs.key(engine.draft)
        cache.put(key, quiet)
        engine.costs.k_policy(SpeculationSettings(None), GREEDY)
        _passes_ran(engine, passes)
        engine.costs.k_policy(SpeculationSettings(None), GREEDY)
        assert engine.costs.passes.prior == quiet
    assert cache.get(key) == quiet


@pytest.mark.parametrize("level", [10.0, 1.5])
def test_a_busy_calibration_goes_within_one_long_request(tiny_models, tmp_path, monkeypatch, level):
    """A calibration `level` times what the loop's passes take: ten times (timed while busy) is set aside
    while the request that found it out still runs, not at the next request or at close; half again as
    dear (reading at another depth) stays."""
    from ollama_spec.decoding.step_costs import StepCosts
    from ollama_spec.engine.calibration import StepCostCache
    from tests.engine.test_step_loop import PassClock

    n = DEFAULT_MAX_SPECULATIVE_TOKENS + 1
    calibration = StepCosts(level * 0.0001, tuple(level * (0.0012 + 0.00005 * (i + 1)) for i in range(n)))
    request = Request(
        "The quick brown fox", max_tokens=120, sampling=GREEDY, ignore_eos=True, speculation=SpeculationSettings(None)
    )
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        engine.costs.cache = cache = StepCostCache(tmp_path / "costs.json")
        key = engine.costs.key(engine.draft)
        cache.put(key, calibration)
        PassClock(engine, monkeypatch, draft_python_s=0.0)  # a draft pass 0.1 ms, a verify 1.2 ms + 0.05 a token
        "".join(engine.generate(request))
        assert engine.loop.steps > CHECK_EVERY_PASSES + 2  # long enough to be checked within it
        assert engine.costs.passes.prior == (None if level > 2 else calibration)
    assert cache.get(key) == (None if level > 2 else calibration)


def test_a_calibration_timed_in_a_busy_spell_is_not_cached_and_the_next_load_times_again(
    tiny_models, tmp_path, monkeypatch, busy_spell
):
    """Other processes kept the cores busy while the steps were timed at load (engine/cpu_wait.py): the
    timing says what that spell did, not what the pair costs. This process's passes price alone from their
    first one (as serve's do with no calibration), a seeded request is not timed again, nothing of the
    spell is cached, and the next process, quiet, times the steps and caches them."""
    from ollama_spec.engine import costs as costs_module
    from ollama_spec.engine.calibration import StepCostCache

    cache = StepCostCache(tmp_path / "costs.json")
    auto = SpeculationSettings(None)
    notes: list[str] = []
    with Engine(tiny_models[0], tiny_models[1], engine_settings(), notice=notes.append) as engine:
        engine.costs.cache = cache
        key = engine.costs.key(engine.draft)
        engine.costs.prepare(auto)
        assert cache.get(key) is None
        assert any("busy" in note and "not cached" in note for note in notes)
        timed, measure = [], costs_module.measure_step_costs
        monkeypatch.setattr(costs_module, "measure_step_costs", lambda *args, **kwargs: timed.append(1))
        engine.costs.k_policy(auto, GREEDY)
        assert engine.costs.passes.prior is None  # the passes price alone
        engine.costs.k_policy(auto, SamplingSettings(temperature=0.8, seed=1))  # keeps the costs as timed
        request = Request("Hi", raw=True, max_tokens=8, sampling=GREEDY, speculation=auto)
        "".join(engine.generate(request))
        assert timed == []
    assert cache.get(key) is None
    busy_spell.calm()
    monkeypatch.setattr(costs_module, "measure_step_costs", measure)
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        engine.costs.cache = cache
        engine.costs.prepare(auto)
        assert cache.get(key) is not None
        engine.costs.k_policy(auto, GREEDY)
        assert engine.costs.passes.prior == cache.get(key)  # a quiet calibration is the passes' prior


def test_the_policy_weighs_tokens_one_by_one_by_the_draft_s_vocabulary(tiny_models):
    """The draft step from which each token is weighed is the draft's own (k_tuning.stops_min_draft_s): a
    draft with Llama 3's vocabulary must cost 2.6 ms a step, one with the tiny pair's 2,048 tokens 0.5 ms."""
    from ollama_spec.decoding.k_tuning import stops_min_draft_s

    speculation = SpeculationSettings(None)
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        assert engine.costs.k_policy(speculation, GREEDY).stops_min_draft_s == stops_min_draft_s(2048) == 0.0005
        engine.draft.n_vocab = 128256
        assert engine.costs.k_policy(speculation, GREEDY).stops_min_draft_s == pytest.approx(2.565e-3, rel=1e-3)


def test_the_cost_key_reads_the_files_once_per_loaded_pair(tiny_models, monkeypatch):
    """Every -k auto request asks the key three times; the loaded pair's files do not change under it."""
    from ollama_spec.engine import calibration

    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        described = []
        real = calibration._describe
        monkeypatch.setattr(calibration, "_describe", lambda path: described.append(path) or real(path))
        keys = {engine.costs.key(engine.draft) for _ in range(5)} | {engine.costs.key(None) for _ in range(5)}
    assert len(keys) == 2 and len(described) == 2 + 1  # the pair's two files, then the target alone's one


def test_a_request_priced_by_the_loop_hands_its_prices_to_the_next(tiny_models, tmp_path):
    """Where the loop's passes price -k auto alone (no calibration), the next request's policy starts from
    the prices the one before it ran by, without working them out again (~55 us of a tiny-pair step of
    0.4 ms, at every request); one that was never priced leaves the next to the passes."""
    from ollama_spec.decoding.step_costs import StepCosts
    from ollama_spec.engine.calibration import StepCostCache

    auto = SpeculationSettings(None)
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        engine.costs.cache, engine.costs.online = StepCostCache(tmp_path / "costs.json"), True
        asked = []
        step_costs = engine.costs.passes.step_costs
        engine.costs.passes.step_costs = lambda *args, **kwargs: asked.append(1) or step_costs(*args, **kwargs)
        earlier = engine.costs.k_policy(auto, GREEDY)
        assert asked == [1] and earlier.priced is None
        engine.costs.keep_learned(auto, earlier)
        assert engine.costs.k_policy(auto, GREEDY).priced is None and asked == [1, 1]  # never priced: the passes
        k_max = earlier.costs.k_max
        earlier.reprice(StepCosts(2e-4, tuple(1e-3 + 1e-4 * n for n in range(k_max + 1))))
        later = engine.costs.k_policy(auto, GREEDY)
        assert asked == [1, 1] and later.priced == earlier.priced is not None


def test_the_calibration_is_checked_once_the_passes_add_up_to_check_every_s(tiny_models, tmp_path):
    """Every CHECK_EVERY_PASSES target passes once their time adds up to CHECK_EVERY_S since the last check,
    and at a request's start where either is due: on the tiny pair (0.2 ms passes, 20 ms answers) a check
    every 16 passes and at every request was ~4 us of each 0.4 ms step. Passes of 40 ms (the demo pair's)
    are checked every 16."""
    from ollama_spec.engine.calibration import StepCostCache
    from ollama_spec.engine.costs import CHECK_EVERY_S

    quiet, _ = _quiet_and_busy(DEFAULT_MAX_SPECULATIVE_TOKENS + 1)
    auto = SpeculationSettings(None)
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        engine.costs.cache = cache = StepCostCache(tmp_path / "costs.json")
        cache.put(engine.costs.key(engine.draft), quiet)
        engine.costs.k_policy(auto, GREEDY)
        checks = []
        check = engine.costs._check_calibration
        engine.costs._check_calibration = lambda: checks.append(engine.costs.passes.target_s) or check()
        for _ in range(int(CHECK_EVERY_S / 0.0002) - 5):  # just short of CHECK_EVERY_S
            engine.costs.observe(False, 2, 0.0002)
        assert checks == []
        engine.costs.k_policy(auto, GREEDY)  # a request's start, CHECK_EVERY_PASSES since: due
        assert len(checks) == 1
        for _ in range(CHECK_EVERY_PASSES - 1):
            engine.costs.observe(False, 2, 0.0002)
        engine.costs.k_policy(auto, GREEDY)
        assert len(checks) == 1  # neither due
        for _ in range(int(CHECK_EVERY_S / 0.0002)):
            engine.costs.observe(False, 2, 0.0002)
        assert len(checks) == 2  # within the passes, once they add up to CHECK_EVERY_S
        for _ in range(2 * CHECK_EVERY_PASSES):
            engine.costs.observe(False, 2, 0.040)
        assert len(checks) == 4
