"""The target's NextN layer follows it lazily (llama/mtp.py): steps that do not draft leave its pairs waiting,
a draft step decodes them in its own pass, and the drafts then read the same cache as if each pass had
been followed at once."""

import numpy as np
import pytest

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.llama.eagle3 import Eagle3Head
from ollama_spec.models.resolve import resolve_model
from ollama_spec.synthetic.mtp_target import write_mtp_target
from tests.conftest import engine_settings

PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def engine(tiny_models, tmp_path_factory):
    path = write_mtp_target(tmp_path_factory.mktemp("mtp") / "mtp-target.gguf", tiny_models[0].path)
    with Engine(resolve_model(str(path)), None, engine_settings(mtp=True)) as engine:
        yield engine


@pytest.fixture
def passes(monkeypatch):
    """The NextN layer's decoder passes: (rows, with outputs)."""
    seen = []
    decode = Eagle3Head._decode

    def counted(self, pairs, *, outputs=False):
        seen.append((len(pairs), outputs))
        return decode(self, pairs, outputs=outputs)

    monkeypatch.setattr(Eagle3Head, "_decode", counted)
    return seen


def run(engine, k, *, use_draft=True, max_tokens=24):
    request = Request(
        PROMPT,
        raw=True,
        max_tokens=max_tokens,
        ignore_eos=True,
        sampling=SamplingSettings(temperature=0),
        speculation=SpeculationSettings(k),
    )
    generation = engine.generate(request, use_draft=use_draft)
    "".join(generation)
    return generation.result


def test_steps_that_do_not_draft_leave_the_nextn_layer_alone(engine, passes):
    engine.clear_cache()
    run(engine, 1, use_draft=False)
    assert passes == []  # 24 target passes, and the layer's pairs wait: fewer than a batch
    assert len(engine.head._waiting) + len(engine.head._state[0].rows[1]) >= 24


def test_a_draft_step_decodes_the_waiting_pairs_first_in_one_pass(engine, passes):
    engine.clear_cache()
    run(engine, 1, use_draft=False)
    drafted = run(engine, 2, max_tokens=8)  # the same prompt: its prefix kept (the pairs before it wait), drafts
    assert drafted.speculation.drafted > 0
    rows, outputs = passes[0]
    assert rows >= 10 and outputs  # the waiting pairs and the first draft step, in one pass


def first_draft(engine):
    """The NextN layer's logits for the first draft after the target's text (nothing drafted before)."""
    engine.clear_cache()
    result = run(engine, 1, use_draft=False, max_tokens=40)
    held = len(engine.target.cached_of(0))
    sequence = engine.head.sequence(0)
    logits = sequence.start(held, result.tokens[-1])
    sequence.finish(held)
    return np.array(logits)


def test_lazy_and_eager_following_give_the_same_drafts(engine, monkeypatch):
    """Every pass followed at once (as an EAGLE-3 head follows) or its pairs left waiting: the layer's cache,
    and so its drafts, are the same."""
    lazy = first_draft(engine)
    monkeypatch.setattr(engine.head, "_decode_all", lambda pairs: Eagle3Head._decode_all(engine.head, pairs))
    eager = first_draft(engine)
    assert engine.head._waiting == []
    assert lazy.shape == eager.shape and np.allclose(lazy, eager, atol=1e-4)
    assert np.abs(lazy).max() > 0
