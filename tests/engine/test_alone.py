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
    with Engine(tiny_models[0], tiny_models[1], engine_settings(lone_in_loop=True)) as engine:
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
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=2, n_ctx=512, lone_in_loop=True)) as engine:
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
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=2, n_ctx=512, lone_in_loop=True)) as engine:
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


def test_by_default_a_lone_request_runs_its_evaluations_directly(tiny_models, monkeypatch):
    """The loop's turn costs a small pair's passes more Python than the direct run (EngineSettings.
    lone_in_loop): off unless asked for, by the settings or $OLLAMA_SPEC_LONE_IN_LOOP=1."""
    from ollama_spec.engine.load_plan import LONE_IN_LOOP_ENV, EngineSettings

    monkeypatch.delenv(LONE_IN_LOOP_ENV, raising=False)
    assert not EngineSettings().lone_in_loop
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        generation = engine.generate(request("Once upon a time", 3))
        assert "".join(generation) and engine.loop.steps == 0 and engine.loop.decodes == 0
    monkeypatch.setenv(LONE_IN_LOOP_ENV, "1")
    assert EngineSettings().lone_in_loop
