"""A sequence's rows are the same bits whatever the model's other sequences hold or evaluate beside it
(issue #45): what `serve --parallel` needs for a greedy answer to depend on its request alone.

Each test runs one script of evaluations and cut-backs on sequence 1, once on a model with nothing
else in it and once among other sequences, and compares every logits row bit for bit: a difference
in the last bit is what flips a greedy choice where the two best tokens are close.
"""

import numpy as np
import pytest

from ollama_spec.llama.model import LoadedModel, LoadSettings
from ollama_spec.models.resolve import resolve_model
from tests.builders.close_pair import build_close_pair

SEQ = 1
# prompt, then one token, a verify batch of five with three rejected, two, one, a batch of six
STEPS = [("eval", 12, 1), ("eval", 1, 1), ("eval", 5, 5), ("cut", 3, 0), ("eval", 2, 2), ("eval", 1, 1)]
STEPS += [("eval", 6, 6), ("cut", 1, 0), ("eval", 1, 1), ("eval", 70, 1), ("eval", 1, 1)]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    root = tmp_path_factory.mktemp("close-store")
    name, _ = build_close_pair(root)
    return resolve_model(name, str(root)).path


@pytest.fixture
def model(target):
    with LoadedModel(target, LoadSettings(n_ctx=512, n_threads=1, n_seq=4)) as model:
        yield model


def tokens(n: int, salt: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(salt).integers(300, 1000, n)]


def run_script(model, beside=lambda step: [], between=lambda step: None) -> list[np.ndarray]:
    """SEQ's rows through STEPS; `beside(step)`: other sequences' items in the same decode;
    `between(step)`: what the others do after each step."""
    rows = []
    for step, (kind, n, n_rows) in enumerate(STEPS):
        if kind == "cut":
            model.truncate(len(model.cached_of(SEQ)) - n, SEQ)
        else:
            rows.append(model.decode_many([(SEQ, tokens(n, step), n_rows), *beside(step)])[0])
        between(step)
    return rows


def assert_same_bits(got, expected):
    assert len(got) == len(expected)
    for step, (a, b) in enumerate(zip(got, expected)):
        assert a.shape == b.shape and np.array_equal(a, b), f"step {step}: rows differ by up to {np.abs(a - b).max()}"


def test_what_other_sequences_hold_and_cut_does_not_change_a_sequences_rows(model):
    alone = run_script(model)
    model.clear_sequence(SEQ)
    model.eval(tokens(30, 100), seq=0)
    model.eval(tokens(50, 101), seq=2)

    def churn(step):  # the others grow and cut back between SEQ's steps, as other slots' verify batches do
        for seq in (0, 2, 3):
            cached = len(model.cached_of(seq))
            model.eval(tokens(4 + step % 3, 200 + step * 7 + seq), seq=seq)
            model.truncate(max(0, cached - 20 if step == 0 else cached + 1), seq)

    assert_same_bits(run_script(model, between=churn), alone)


def test_evaluating_beside_other_sequences_gives_the_rows_a_sequence_gets_alone(model):
    alone = run_script(model)
    model.clear_sequence(SEQ)
    for seq in (0, 2, 3):
        model.eval(tokens(20 + seq, 300 + seq), seq=seq)

    def others(step):  # items of other lengths, a single token among them, and a gap (sequence 3 alone)
        return (
            [(0, tokens(1 + step % 4, 400 + step), 1), (3, tokens(3, 500 + step), 3)]
            if step % 2
            else [(2, tokens(7, 600 + step), 7)]
        )

    assert_same_bits(run_script(model, beside=others), alone)


def test_a_prompt_read_after_its_cached_first_part_gives_the_rows_of_one_read_whole(model):
    prompt = tokens(150, 700)
    whole = model.eval(prompt, logits=2, seq=SEQ)
    model.clear_sequence(SEQ)
    model.eval(prompt[:40], seq=SEQ)
    assert np.array_equal(model.eval(prompt[40:], logits=2, seq=SEQ), whole)


def test_a_sequence_restored_in_another_slot_continues_with_the_original_rows(model):
    prompt, more = tokens(40, 800), tokens(5, 801)
    model.eval(tokens(30, 802), seq=2)  # the slot it comes back to held something else
    model.eval(prompt, seq=0)
    state = model.save_sequence(0)
    original = model.eval(more, logits=5, seq=0)
    assert model.restore_sequence(2, state, prompt)
    assert np.array_equal(model.eval(more, logits=5, seq=2), original)
