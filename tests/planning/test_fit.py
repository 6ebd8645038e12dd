"""The one fit: the context and slots a pair loads with on the memory left beside what is taken, or the plan's
words for why it does not fit. Header-only 70B- and 1B-shaped models on made-up machines."""

from __future__ import annotations

import pytest

from ollama_spec.errors import InsufficientMemory
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.planning.context import ContextChoice
from ollama_spec.planning.devices import GIB, nvidia_gpu, system_ram
from ollama_spec.planning.fit import PairFacts, fit_pair, less_taken
from tests.builders.shapes import write_shape_only_gguf
from tests.planning.test_memory import LLAMA3_VOCAB, LLAMA_1B, LLAMA_70B


@pytest.fixture(scope="module")
def facts(sparse_dir) -> PairFacts:
    target, draft = sparse_dir / "fit-70b.gguf", sparse_dir / "fit-1b.gguf"
    write_shape_only_gguf(target, name="llama3.1:70b", arch=LLAMA_70B, vocab_size=LLAMA3_VOCAB)
    write_shape_only_gguf(draft, name="llama3.2:1b", arch=LLAMA_1B, vocab_size=LLAMA3_VOCAB)
    return PairFacts(read_model_info(target), read_model_info(draft), repack=False)


def test_the_most_slots_that_fit_at_the_asked_context(facts):
    machine = [nvidia_gpu(80), system_ram(64)]
    alone = fit_pair(facts, ContextChoice(8192, False, "asked"), [4, 3, 2, 1], machine)
    assert (alone.n_ctx, alone.slots, alone.lowered_from) == (8192, 4, None) and alone.plan.fits
    squeezed = fit_pair(facts, ContextChoice(32768, False, "asked"), [4, 3, 2, 1], [nvidia_gpu(48), system_ram(8)])
    assert squeezed.slots < 4 and squeezed.plan.fits and squeezed.plan.n_seq == squeezed.slots


def test_an_automatic_context_is_lowered_a_tier_and_an_asked_one_refused(facts):
    machine = [nvidia_gpu(48), system_ram(8)]
    lowered = fit_pair(facts, ContextChoice(262144, True, "default"), [1], machine)
    assert lowered.n_ctx < 262144 and lowered.lowered_from == 262144 and lowered.plan.fits
    with pytest.raises(InsufficientMemory, match="does not fit"):
        fit_pair(facts, ContextChoice(262144, False, "asked"), [1], machine)


def test_what_loaded_pairs_take_is_left_out(facts):
    machine = [nvidia_gpu(80), system_ram(64)]
    assert fit_pair(facts, ContextChoice(8192, False, "asked"), [1], machine).plan.fits
    with pytest.raises(InsufficientMemory):
        fit_pair(facts, ContextChoice(8192, False, "asked"), [1], machine, taken=(70 * GIB, 60 * GIB))


def test_less_taken_takes_gpu_bytes_from_the_gpus_in_order_and_host_bytes_from_ram():
    left = less_taken([nvidia_gpu(24), nvidia_gpu(24), system_ram(64)], 30 * GIB, 10 * GIB)
    assert [d.free // GIB for d in left] == [0, 18, 54]
