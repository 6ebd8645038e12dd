"""An EAGLE-3 head drafting for tiny-target: greedy text is the target's alone, whatever the head and K,
on one slot and on four, with prompts longer than one batch; a crafted head gets most of its drafts
accepted, a random one next to none; a seeded sample follows the target's own distribution."""

import llama_cpp
import pytest

from ollama_spec.decoding.eagle3 import HEAD
from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.penalties import Penalties
from ollama_spec.decoding.proposers import HYBRID, NGRAM
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request, pair_facts
from ollama_spec.engine.sinks import stream
from ollama_spec.errors import InvalidSetting
from ollama_spec.llama.grammar import grammar_for_json
from ollama_spec.planning.needs import captured_rows_bytes, model_needs
from tests.builders.eagle3_heads import build_heads
from tests.conftest import engine_settings

GREEDY = SamplingSettings(temperature=0)
# over 512 tokens: the prompt is read in two batches, and the head follows both
LONG = " ".join(f"item {i} is {'odd' if i % 2 else 'even'};" for i in range(130))
PROMPTS = [LONG, "The quick brown fox", "Once upon a time", "def main():\n    return 4"]


@pytest.fixture(scope="module")
def heads(tiny_models, tmp_path_factory):
    return build_heads(tiny_models[0].path, tmp_path_factory.mktemp("heads"))


@pytest.fixture(scope="module")
def expected(baseline_engine):
    return {p: answer(baseline_engine, request(p)).tokens for p in PROMPTS}


def request(prompt, k=4, **fields):
    fields = {"max_tokens": 40, "ignore_eos": True, "sampling": GREEDY, "speculation": SpeculationSettings(k)} | fields
    return Request(prompt, raw=True, **fields)


def answer(engine, req, slot=0):
    generation = engine.generate(req, slot=slot)
    "".join(generation)
    return generation.result


@pytest.mark.parametrize("kind", ["random", "crafted", "reduced", "borrowing"])
def test_greedy_text_is_the_targets_at_every_k(kind, heads, tiny_models, expected):
    with Engine(tiny_models[0], None, engine_settings(head=heads[kind])) as engine:
        assert len(engine.prompt_tokens(request(LONG))) > 512
        for k in (1, 2, 4, 8):
            for prompt in PROMPTS:
                assert answer(engine, request(prompt, k)).tokens == expected[prompt], (kind, k, prompt)


@pytest.mark.parametrize(("kind", "low", "high"), [("random", 0.0, 0.2), ("crafted", 0.5, 1.0), ("reduced", 0.5, 1.0)])
def test_acceptance_at_k1_is_the_heads(kind, low, high, heads, tiny_models):
    """The crafted heads know the target's bigrams (the head reads the right token at each position);
    the random one guesses."""
    with Engine(tiny_models[0], None, engine_settings(head=heads[kind])) as engine:
        drafted = accepted = 0
        for prompt in PROMPTS[1:]:
            stats = answer(engine, request(prompt, 1, max_tokens=100)).speculation
            drafted, accepted = drafted + stats.drafted, accepted + stats.accepted
    assert drafted > 150
    assert low <= accepted / drafted <= high, (kind, accepted / drafted)


@pytest.mark.parametrize("kind", ["random", "crafted", "reduced"])
def test_four_slots_together_write_the_targets_text(kind, heads, tiny_models):
    """One head sequence a slot: each slot's greedy text is the target's alone (with four slots a
    row's sums are those of a sequence in a stream of its own: llama/passes.py), at every K."""
    with Engine(tiny_models[0], None, engine_settings(head=heads[kind], parallel=4)) as engine:
        expected = {}
        for prompt in PROMPTS:
            generation = engine.generate(request(prompt), use_draft=False)
            "".join(generation)
            expected[prompt] = generation.result.tokens
        for k in (1, 2, 4, 8):
            with engine.loop.together():  # admitted at the same turn: their steps share every pass
                running = {p: stream(engine.loop, request(p, k), engine.prompt_tokens(request(p, k))) for p in PROMPTS}
            results = {}
            for prompt, (ticket, pieces) in running.items():
                "".join(pieces)
                results[prompt] = ticket.generation.result.tokens
            assert results == expected, (kind, k)


@pytest.mark.parametrize("k", [1, 3])
def test_a_lone_step_is_one_encoder_pass_and_one_decoder_pass_a_draft(heads, tiny_models, k):
    """Alone, a step at K is the target's pass, one encoder pass and K decoder passes: the pairs a verify
    pass completes ride in the first draft step's pass (llama-server's driver decodes them in a pass of
    their own, K + 3 passes a step)."""
    with Engine(tiny_models[0], None, engine_settings(head=heads["crafted"])) as engine:
        process, calls = engine.head._process, []
        engine.head._process = lambda kind, n: calls.append(kind) or process(kind, n)
        stats = answer(engine, request(PROMPTS[1], k, max_tokens=60)).speculation
    drafting_steps = sum(stats.k_chosen.values())
    assert stats.drafted > 20 and drafting_steps > 10
    assert calls.count(llama_cpp.LLAMA_PROCESS_TYPE_DECODE) == stats.drafted
    assert calls.count(llama_cpp.LLAMA_PROCESS_TYPE_ENCODE) == drafting_steps


def test_four_slots_draft_in_one_pass_of_the_head(heads, tiny_models):
    """Each draft step of every drafting slot is one pass of the head (as a draft model's), with the
    pairs the last verify pass left waiting, and -k auto learns the head's pass times from them."""
    prompts = [*PROMPTS[1:], "Hello there, how are"]
    with Engine(tiny_models[0], None, engine_settings(head=heads["crafted"], parallel=4)) as engine:
        expected = {}
        for prompt in prompts:
            generation = engine.generate(request(prompt), use_draft=False)
            "".join(generation)
            expected[prompt] = generation.result.tokens
        process, calls = engine.head._process, []
        engine.head._process = lambda kind, n: calls.append(kind) or process(kind, n)
        engine.loop.passes = []
        with engine.loop.together():
            running = {p: stream(engine.loop, request(p, 4), engine.prompt_tokens(request(p, 4))) for p in prompts}
        for prompt, (ticket, pieces) in running.items():
            "".join(pieces)
            assert ticket.generation.result.tokens == expected[prompt]
        drafts = [p.sequences for p in engine.loop.passes if p.model == 1]
        targets = [p for p in engine.loop.passes if p.model == 0]
        assert drafts.count(4) >= 0.8 * len(targets) and len(drafts) <= 4 * len(targets)
        # the head's decoder runs once a draft pass (and at most once a slot to catch up), its encoder
        # once a step, for every slot's rows as the first draft pass needs them
        assert len(drafts) <= calls.count(llama_cpp.LLAMA_PROCESS_TYPE_DECODE) <= len(drafts) + 4
        assert abs(calls.count(llama_cpp.LLAMA_PROCESS_TYPE_ENCODE) - len(targets)) <= 4
        assert set(engine.costs.passes._draft._seen) >= {4}  # the head's passes of 4 rows, as timed


def test_grammar_penalties_and_lookup_beside_the_head(heads, tiny_models, baseline_engine):
    """Structured output, a repeat penalty, and prompt lookup with the head (draft+ngram): each
    greedy text is the target's alone."""
    cases = {
        "grammar": request(PROMPTS[1], grammar=grammar_for_json(), ignore_eos=False),
        "penalty": request(
            PROMPTS[2], sampling=SamplingSettings(temperature=0, penalties=Penalties(repeat_penalty=1.3))
        ),
        "lookup": request(LONG, speculation=SpeculationSettings(4, proposer=HYBRID)),
    }
    with Engine(tiny_models[0], None, engine_settings(head=heads["crafted"])) as engine:
        for name, req in cases.items():
            got = answer(engine, req)
            assert got.tokens == answer(baseline_engine, req).tokens, name
            assert got.speculation.drafted_by_source, name
        assert set(got.speculation.drafted_by_source) <= {HEAD, NGRAM}


def test_the_memory_plan_counts_the_head_and_the_rows_its_target_captures(heads, tiny_models):
    settings = engine_settings(head=heads["crafted"])
    facts = pair_facts(tiny_models[0], None, settings)
    assert facts.draft.architecture == "eagle3"
    assert captured_rows_bytes(facts.draft) == 3 * tiny_models[0].info.embedding_length * 512 * 4
    needs = model_needs(facts.draft, 2048)
    assert needs.kv > 0 and needs.output_buffer > captured_rows_bytes(facts.draft)


def test_a_head_and_a_draft_model_together_are_refused(heads, tiny_models):
    with pytest.raises(InvalidSetting, match="a draft model and an EAGLE-3 head cannot both draft"):
        Engine(tiny_models[0], tiny_models[1], engine_settings(head=heads["crafted"]))


def test_auto_k_prices_the_heads_steps(heads, tiny_models, expected, monkeypatch):
    """-k auto times a head's draft step (the calibration runs the head's decoder at the target's
    boundary, each time the target's passes were cut back) and keeps the target's greedy text."""
    with Engine(tiny_models[0], None, engine_settings(head=heads["crafted"])) as engine:
        steps = []
        decode_many = engine.head.decode_many
        position = lambda items: engine.head._state[items[0][0]].drafting[0]
        monkeypatch.setattr(
            engine.head, "decode_many", lambda items: steps.append(position(items)) or decode_many(items)
        )
        engine.costs.calibrated(engine.costs.draft, 8)
        assert len(steps) >= 5 and len(set(steps)) == 1  # every timed step at the same boundary
        for prompt in PROMPTS[1:]:
            assert answer(engine, request(prompt, None)).tokens == expected[prompt]


def test_a_head_for_a_recurrent_target_is_refused(heads, tmp_path):
    from ollama_spec.models.resolve import resolve_model
    from tests.builders.recurrent import write_mamba_gguf

    path = tmp_path / "mamba.gguf"
    write_mamba_gguf(path)
    with pytest.raises(InvalidSetting, match="recurrent or hybrid model: .* an EAGLE-3 head cannot draft for it"):
        Engine(resolve_model(str(path)), None, engine_settings(head=heads["crafted"]))


def test_a_head_for_another_target_is_refused_at_load(tiny_models, tiny_store, tmp_path):
    """A head whose target layers lie past the target's, or made for another vocabulary: one line each."""
    from ollama_spec.errors import ModelLoadError
    from ollama_spec.models.resolve import resolve_model
    from ollama_spec.synthetic.catalog import ALIEN_NAME
    from ollama_spec.synthetic.eagle3_head import write_eagle3_head

    path = tmp_path / "deep.gguf"
    write_eagle3_head(path, tiny_models[0].path, "random", target_layers=(2, 16, 29))
    with pytest.raises(ModelLoadError, match=r"reads target layers \[2, 16, 29\].*which has 4"):
        Engine(tiny_models[0], None, engine_settings(head=path))
    alien = tmp_path / "alien.gguf"
    write_eagle3_head(alien, resolve_model(ALIEN_NAME, str(tiny_store)).path, "random", target_layers=(0, 0, 0))
    with pytest.raises(ModelLoadError, match="has a vocabulary of 1024 tokens; its target's has 512"):
        Engine(tiny_models[0], None, engine_settings(head=alien))


def test_a_head_given_as_the_draft_drafts_as_the_head(heads, tiny_models, expected):
    """--draft HEAD, a pair or the store's pick hands the Engine a head as its draft model: it loads as the head."""
    from ollama_spec.models.resolve import resolve_model

    head = resolve_model(str(heads["crafted"]))
    with Engine(tiny_models[0], head, engine_settings()) as engine:
        assert engine.draft is None and engine.head is not None
        assert engine.settings.head == heads["crafted"]
        result = answer(engine, request(PROMPTS[1], 2))
    assert result.tokens == expected[PROMPTS[1]]
    assert result.speculation.accepted > 0
