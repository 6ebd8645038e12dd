"""A target's MTP layers chosen by default stay only where their priced goodput beats the target alone
(engine/mtp_default.py): priced from this machine's calibrated step costs at MTP's published acceptance. Costs
are set here, both ways, so the verdict does not depend on the machine's speed."""

from dataclasses import replace

import pytest

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.decoding.step_costs import StepCosts
from ollama_spec.engine.costs import LearnedCosts
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.engine.mtp_default import MTP_PRIOR_ALPHA
from ollama_spec.models.resolve import resolve_model
from ollama_spec.synthetic.mtp_target import write_mtp_target
from tests.conftest import engine_settings

TARGET_STEP = 0.010
CHEAP = StepCosts(0.0005, tuple(TARGET_STEP * (1 + 0.02 * n) for n in range(17)))  # a GPU's NextN layer
DEAR = StepCosts(0.008, tuple(TARGET_STEP * (1 + 0.5 * n) for n in range(17)))  # a draft step near a target's


@pytest.fixture(scope="module")
def mtp_target(tiny_models, tmp_path_factory):
    path = write_mtp_target(tmp_path_factory.mktemp("mtp") / "mtp-target.gguf", tiny_models[0].path)
    return resolve_model(str(path))


def priced(monkeypatch, costs):
    monkeypatch.setattr(LearnedCosts, "calibrated", lambda self, draft, k_max: costs)


def greedy(engine, k=None):
    request = Request("Once upon a time", raw=True, max_tokens=12, ignore_eos=True,
                      sampling=SamplingSettings(temperature=0), speculation=SpeculationSettings(k))  # fmt: skip
    generation = engine.generate(request)
    "".join(generation)
    return generation.result


def test_the_layers_stay_where_some_k_pays(mtp_target, monkeypatch):
    assert CHEAP.tokens_per_second(MTP_PRIOR_ALPHA, 3) > CHEAP.tokens_per_second(MTP_PRIOR_ALPHA, 0)
    priced(monkeypatch, CHEAP)
    with Engine(mtp_target, None, engine_settings(mtp=True, mtp_where_it_pays=True)) as engine:
        assert engine.head is not None and engine.settings.mtp
        assert greedy(engine, 2).speculation.drafted > 0


def test_the_layers_go_where_no_k_pays_and_the_target_runs_alone(mtp_target, monkeypatch):
    assert all(DEAR.tokens_per_second(1.0, k) < DEAR.tokens_per_second(1.0, 0) for k in range(1, 17))
    priced(monkeypatch, DEAR)
    notes = []
    with Engine(mtp_target, None, engine_settings(mtp=True, mtp_where_it_pays=True), notice=notes.append) as engine:
        assert engine.head is None and not engine.settings.mtp and engine.target.observer is None
        alone = greedy(engine, 2)
        assert alone.speculation.drafted == 0
    said = "the target's MTP layers would not pay on this machine (a draft step costs 8.00 ms beside a target step"
    assert notes == [f"{said} of 10.00 ms): the target runs alone"]
    assert engine.settings.mtp_let_go == f"{said} of 10.00 ms)".replace("the target's", "its")  # the server says it
    with Engine(mtp_target, None, engine_settings()) as plain:
        assert greedy(plain).tokens == alone.tokens


def test_mtp_named_is_kept_whatever_it_costs(mtp_target, monkeypatch):
    priced(monkeypatch, DEAR)
    with Engine(mtp_target, None, engine_settings(mtp=True)) as engine:
        assert engine.head is not None


def test_layers_that_do_not_fit_beside_the_target_are_let_go_before_loading(mtp_target, monkeypatch):
    from ollama_spec.engine.engine import pair_facts
    from ollama_spec.errors import InsufficientMemory
    from ollama_spec.llama import backends
    from ollama_spec.planning.devices import GIB, system_ram

    priced(monkeypatch, CHEAP)
    settings = engine_settings(memory_check=True, mtp=True, mtp_where_it_pays=True)
    need = {mtp: pair_facts(mtp_target, None, replace(settings, mtp=mtp)).plan(2048, 1, [system_ram(64)]).host_bytes
            for mtp in (False, True)}  # fmt: skip
    assert need[True] > need[False]
    ram = system_ram(64, (need[False] + need[True]) / 2 / GIB)  # the target fits, with its MTP layers it does not
    monkeypatch.setattr(backends, "discover_devices", lambda: ([ram], []))
    notes = []
    with Engine(mtp_target, None, settings, notice=notes.append) as engine:
        assert engine.head is None and not engine.settings.mtp
    assert notes[0].startswith("the target's MTP layers do not fit beside it (does not fit: needs")
    assert engine.settings.mtp_let_go.startswith("its MTP layers do not fit beside it (does not fit: needs")
    with pytest.raises(InsufficientMemory):  # named, they are not let go
        Engine(mtp_target, None, replace(settings, mtp_where_it_pays=False))
