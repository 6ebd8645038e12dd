"""The copying pair: a hand-set target that repeats what it read (an induction head) and breaks off
at a comma into its bigram text, which its draft writes exactly; prompt lookup and the draft each
cover one half, the hybrid both (through real llama.cpp inference)."""

import pytest

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.models.resolve import resolve_model
from ollama_spec.synthetic.copying import DRAFT_NAME, TARGET_NAME, build_copy_pair_store
from tests.conftest import engine_settings

GREEDY = SamplingSettings(temperature=0)
PASSAGE = "Lighthouses were once kept by families who lived beside the lamp"


@pytest.fixture(scope="module")
def copying(tmp_path_factory):
    root = tmp_path_factory.mktemp("copy-store")
    build_copy_pair_store(root, n_filler=0, n_ff=64)  # no filler: the same circuit, small and quick
    target, draft = resolve_model(TARGET_NAME, root), resolve_model(DRAFT_NAME, root)
    with Engine(target, draft, engine_settings()) as engine:
        yield engine


def generate(engine, prompt, speculation=None, raw=True, max_tokens=24):
    request = Request(
        prompt,
        raw=raw,
        max_tokens=max_tokens,
        ignore_eos=True,
        sampling=GREEDY,
        speculation=speculation or SpeculationSettings(),
    )
    generation = engine.generate(request, use_draft=speculation is not None)
    return "".join(generation), generation.result


def test_the_target_copies_what_it_read_and_stops_copying_at_a_comma(copying):
    text, _ = generate(copying, f"Text: {PASSAGE}\nAgain: Lighthouses were")
    assert text.startswith(" once kept by famil")
    text, _ = generate(copying, "Text: the keeper climbed, then slept\nAgain: the keeper")
    assert text.startswith(" climbed,") and not text.startswith(" climbed, then")


def test_lookup_covers_the_copy_the_draft_the_rest_and_the_output_is_the_targets(copying):
    prompt = f"Repeat the following paragraph exactly, then give it a title:\n\n{PASSAGE}."
    expected, _ = generate(copying, prompt, raw=False, max_tokens=96)
    hybrid = SpeculationSettings(4, proposer="draft+ngram")  # without filler the draft costs a target step: K fixed
    text, result = generate(copying, prompt, hybrid, raw=False, max_tokens=96)
    assert text == expected
    accepted = result.speculation.accepted_by_source
    assert accepted.get("ngram", 0) >= 4 and accepted.get("draft", 0) >= 20
