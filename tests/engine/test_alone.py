"""A request alone is the step loop with one slot, on the iterating thread when the loop runs nothing else."""

import threading

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.engine.sinks import stream
from tests.conftest import engine_settings

GREEDY = SamplingSettings(temperature=0)
BOUND_S = 120  # every wait on another thread is bounded


def request(prompt, k=None, max_tokens=24):
    return Request(
        prompt, raw=True, max_tokens=max_tokens, ignore_eos=True, sampling=GREEDY, speculation=SpeculationSettings(k)
    )


def loop_threads():
    return [thread for thread in threading.enumerate() if thread.name == "ollama-spec-steps"]


def drained(pieces, into):
    """Read `pieces` on a thread of its own (bounded: the caller joins it with a timeout)."""
    thread = threading.Thread(target=lambda: into.append("".join(pieces)), daemon=True)
    thread.start()
    return thread


def test_a_lone_request_runs_the_loops_turns_on_the_calling_thread(tiny_models, baseline_engine):
    expected = baseline_engine.generate(request("Once upon a time"), use_draft=False)
    expected_text = "".join(expected)
    threads = loop_threads()
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        for k in (None, 3):  # -k auto: the loop's K choice, priced by its passes
            generation = engine.generate(request("Once upon a time", k))
            steps, decodes = engine.loop.steps, engine.loop.decodes
            assert "".join(generation) == expected_text
            assert generation.result.tokens == expected.result.tokens
            assert engine.loop.steps - steps == generation.result.speculation.steps  # each step a turn of the loop
            assert engine.loop.decodes > decodes
            engine.clear_cache()
        assert loop_threads() == threads  # no thread of its own: the caller's ran every turn


def test_a_request_queued_while_a_caller_holds_the_loop_goes_on_in_the_loops_thread(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=2, n_ctx=512)) as engine:
        expected = {p: "".join(engine.generate(request(p, 3))) for p in ("Once upon a time", "The quick brown fox")}
        engine.clear_cache()
        lone = iter(engine.generate(request("Once upon a time", 3), slot=1))
        first = next(lone)  # the caller holds the loop
        other = request("The quick brown fox", 3)
        _, pieces = stream(engine.loop, other, engine.prompt_tokens(other))
        texts = []
        reader = drained(pieces, texts)
        assert first + "".join(lone) == expected["Once upon a time"]
        reader.join(BOUND_S)  # let go, the loop's thread runs what joined meanwhile
        assert texts == [expected["The quick brown fox"]]


def test_a_lone_request_beside_running_ones_joins_the_loops_thread(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=2, n_ctx=512)) as engine:
        expected = "".join(engine.generate(request("Once upon a time", 3), slot=1))
        engine.clear_cache()
        long = request("The quick brown fox", 3, max_tokens=200)
        ticket, pieces = stream(engine.loop, long, engine.prompt_tokens(long))
        texts = []
        reader = drained(pieces, texts)
        generation = engine.generate(request("Once upon a time", 3), slot=1)
        assert "".join(generation) == expected
        reader.join(BOUND_S)
        assert len(texts) == 1 and len(ticket.generation.result.tokens) == 200


def test_a_lone_requests_passes_set_a_calibration_taken_while_busy_aside(tiny_models, tmp_path):
    """A lone request's passes price the steps as a batch's do (engine/costs.py): a calibration far
    dearer than they take (timed while the machine was busy) does not price the next request, and the
    cache forgets it when the engine closes, so the next process times the steps again."""
    from ollama_spec.decoding.loop import DEFAULT_MAX_SPECULATIVE_TOKENS
    from ollama_spec.decoding.step_costs import StepCosts
    from ollama_spec.engine.calibration import StepCostCache

    cache = StepCostCache(tmp_path / "costs.json")
    # a second a pass: the tiny pair's take well under a millisecond, however busy the machine is now
    busy = StepCosts(1.0, tuple(1.0 + 0.1 * n for n in range(DEFAULT_MAX_SPECULATIVE_TOKENS + 1)))
    with Engine(tiny_models[0], tiny_models[1], engine_settings(n_ctx=512)) as engine:
        engine.costs.cache = cache
        key = engine.costs.key(engine.draft)
        cache.put(key, busy)
        assert "".join(engine.generate(request("Once upon a time", max_tokens=32)))  # -k auto
        policy = engine.costs.k_policy(SpeculationSettings(None), GREEDY)
        assert engine.costs.passes.prior is None and policy.costs.verify_s[0] < 0.1  # priced by the passes
    assert cache.get(key) is None
