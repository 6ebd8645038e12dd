"""Slots: requests that run together in the step loop, each in its own sequence, their evaluations in
shared passes: every slot's greedy text is the one it gives alone, and slots come and go between steps."""

import pytest

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.penalties import Penalties
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.engine.sinks import stream
from ollama_spec.llama.grammar import grammar_for_json
from tests.conftest import engine_settings

GREEDY = SamplingSettings(temperature=0)
PROMPTS = ["The quick brown fox", "Once upon a time", "In a hole in the ground", "It was a bright cold day"]


@pytest.fixture(scope="module")
def engine(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=4, n_ctx=512)) as engine:
        yield engine


def request(prompt, **fields):
    fields = {"max_tokens": 40, "ignore_eos": True, "sampling": GREEDY, "speculation": SpeculationSettings(4)} | fields
    return Request(prompt, raw=True, **fields)


def start(engine, req):
    return stream(engine.loop, req, engine.prompt_tokens(req))


def finish(ticket, pieces, stop_after=None):
    for i, _ in enumerate(pieces):
        if stop_after is not None and i >= stop_after:
            ticket.cancel()  # the slot is freed at the next step
    return ticket.generation.result.tokens, ticket.slot


def together(engine, requests, stop_after=None):
    """The requests admitted at the same turn of the step loop: their steps share every pass."""
    with engine.loop.together():
        started = {key: start(engine, req) for key, req in requests.items()}
    return {key: finish(*both, (stop_after or {}).get(key)) for key, both in started.items()}


def alone(engine, req):
    return finish(*start(engine, req))[0]


def test_four_slots_together_write_what_each_writes_alone(engine):
    requests = {p: request(p) for p in PROMPTS}
    expected = {p: alone(engine, r) for p, r in requests.items()}
    before = engine.loop.decodes
    got = together(engine, requests)
    assert {p: tokens for p, (tokens, _) in got.items()} == expected
    assert len({slot for _, slot in got.values()}) == 4  # each its own slot
    # batched: far fewer passes than four requests' worth one at a time
    assert engine.loop.decodes - before < sum(len(t) for t in expected.values())


def test_a_request_that_leaves_early_does_not_disturb_the_others(engine):
    requests = {p: request(p) for p in PROMPTS[:3]}
    expected = {p: alone(engine, r) for p, r in requests.items()}
    got = together(engine, requests, stop_after={PROMPTS[0]: 3})
    assert got[PROMPTS[1]][0] == expected[PROMPTS[1]] and got[PROMPTS[2]][0] == expected[PROMPTS[2]]
    assert got[PROMPTS[0]][0] == expected[PROMPTS[0]][: len(got[PROMPTS[0]][0])]


def test_sampling_grammar_and_penalties_stay_per_slot(engine):
    """A seeded sample, a grammar and penalties in one slot each: each as it runs alone."""
    requests = {
        "seeded": request(PROMPTS[0], sampling=SamplingSettings(temperature=1.0, seed=7)),
        "grammar": request(PROMPTS[1], grammar=grammar_for_json(), ignore_eos=False),
        "penalties": request(
            PROMPTS[2], sampling=SamplingSettings(temperature=0, penalties=Penalties(repeat_penalty=1.3))
        ),
        "plain": request(PROMPTS[3]),
    }
    expected = {key: alone(engine, r) for key, r in requests.items()}
    got = together(engine, requests)
    assert {key: tokens for key, (tokens, _) in got.items()} == expected


def test_a_slot_reaching_its_context_end_stops_there_alone(engine):
    long_prompt = " ".join(["word"] * 150)
    requests = {"long": request(long_prompt, max_tokens=10_000), "short": request(PROMPTS[0])}
    expected = {key: alone(engine, r) for key, r in requests.items()}
    got = together(engine, requests)
    n_prompt = len(engine.prompt_tokens(requests["long"]))
    # its own n_ctx: the last token is emitted, not evaluated
    assert n_prompt + len(got["long"][0]) == engine.target.n_ctx + 1
    assert {key: tokens for key, (tokens, _) in got.items()} == expected


def test_a_chats_next_turn_lands_in_its_slot(engine):
    """The slot with the longest shared prefix: a longer prompt that starts with an earlier one."""
    tokens, slot = finish(*start(engine, request(PROMPTS[0])))
    text = engine.target.detokenize(tokens)
    assert finish(*start(engine, request(PROMPTS[0] + text + " and then")))[1] == slot


def test_a_recurrent_target_gets_one_slot(tmp_path):
    """A recurrent state cannot be cut back per sequence: --parallel 4 still loads one slot."""
    from ollama_spec.models.resolve import resolve_model
    from tests.builders.recurrent import write_mamba_gguf

    mamba = resolve_model(str(write_mamba_gguf(tmp_path / "mamba.gguf")))
    with Engine(mamba, None, engine_settings(parallel=4, n_ctx=256)) as engine:
        assert engine.slots == 1
        req = request("Hello there", speculation=SpeculationSettings(3), max_tokens=8)
        assert len(alone(engine, req)) == 8


def test_a_padded_vocabulary_pair_in_slots_writes_what_it_writes_alone(tiny_store, tmp_path):
    """The target pads 64 ids past its draft's vocabulary: each slot's drafts stay on the shared ids."""
    from ollama_spec.models.resolve import resolve_model
    from ollama_spec.synthetic import build_pair_store
    from tests.builders.variants import build_padded_target

    build_pair_store(tmp_path, "tiny")
    name = build_padded_target(tmp_path)
    target, draft = resolve_model(name, str(tmp_path)), resolve_model("tiny-draft", str(tmp_path))
    with Engine(target, draft, engine_settings(parallel=3, n_ctx=256)) as engine:
        requests = {p: request(p) for p in PROMPTS[:3]}
        expected = {p: alone(engine, r) for p, r in requests.items()}
        got = together(engine, requests)
        assert {p: tokens for p, (tokens, _) in got.items()} == expected


def test_an_engine_with_slots_on_a_cpu_loads_both_models_with_the_timed_kind(engine):
    # (the rule: tests/llama/test_load_params.py; the timing: tests/engine/test_flash_choice.py)
    assert engine.flash_attention in ("on", "off")
    assert engine.target.settings.flash_attention == engine.draft.settings.flash_attention == engine.flash_attention
