"""The step loop on a busy machine: what other processes take of its core is no part of a pass's price."""

import pytest

from ollama_spec.engine import cpu_wait
from ollama_spec.engine.engine import Engine
from tests.conftest import engine_settings
from tests.engine.test_step_loop import PassClock, request

DESCHEDULED_S = 0.005  # a slice another process ran while the loop waited for the core (a CFS slice: ~3-6 ms)


def lone_auto_request(engine, tmp_path, monkeypatch, every):
    """A lone -k auto request on PassClock's clock, every `every`-th target pass (0: none) kept off its
    core DESCHEDULED_S: the prices told to the loop's PassPrices, the tokens and the tokens drafted."""
    from ollama_spec.engine.calibration import StepCostCache

    engine.costs.cache = StepCostCache(tmp_path / f"costs-{every}.json")
    engine.costs.online = True  # priced from the passes only (nothing timed on the real clock)
    clock, waited, passes = PassClock(engine, monkeypatch, draft_python_s=0.0001), [0.0], [0]
    monkeypatch.setattr(cpu_wait, "thread_waited_s", lambda: waited[0])
    decode_many = engine.target.decode_many

    def descheduled(items):
        passes[0] += 1
        if every and passes[0] % every == 0:
            clock.now += DESCHEDULED_S
            waited[0] += DESCHEDULED_S
        return decode_many(items)

    monkeypatch.setattr(engine.target, "decode_many", descheduled)
    prices, observed = engine.costs.passes, []
    observe = prices.observe
    monkeypatch.setattr(prices, "observe", lambda *seen: observed.append(seen) or observe(*seen))
    generation = engine.generate(request("The quick brown fox", max_tokens=64))
    "".join(generation)
    return observed, generation.result.tokens, generation.result.speculation.drafted


def test_a_lone_auto_request_prices_and_drafts_as_on_a_quiet_machine_when_its_passes_lose_the_core(
    tiny_models, tmp_path, monkeypatch
):
    """Two processes spinning on the tiny pair's two cores took 0.1-10 ms slices from the loop at random, the
    smallest passes weighing most: priced with them, a target pass of one token cost as much as one of 13,
    and a lone slot drafted deeper than any fixed K that paid. Priced by the time the loop ran, one pass in
    three kept off the core changes neither a price nor a drafted token."""
    runs = []
    for every in (0, 3):
        with Engine(tiny_models[0], tiny_models[1], engine_settings(n_ctx=512)) as engine:
            runs.append(lone_auto_request(engine, tmp_path, monkeypatch, every))
        monkeypatch.undo()
    (quiet, tokens, drafted), (busy, busy_tokens, busy_drafted) = runs
    assert drafted >= 16 and [seen[:2] for seen in busy] == [seen[:2] for seen in quiet]
    assert [seconds for *_, seconds in busy] == pytest.approx([seconds for *_, seconds in quiet])
    assert (busy_tokens, busy_drafted) == (tokens, drafted)
