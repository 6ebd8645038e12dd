import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from ollama_spec.synthetic.kquant_blocks import live_mask, random_blocks


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K])
def test_random_blocks_decode_to_the_asked_spread(qtype):
    blocks = random_blocks(qtype, 64, 1024, 0.02, np.random.default_rng(1))
    values = quants.dequantize(blocks, qtype)  # gguf-py's own decoder reads our layout
    assert values.shape == (64, 1024)
    assert values.std() == pytest.approx(0.02, rel=0.03) and abs(values.mean()) < 0.002


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K])
def test_dead_sub_blocks_are_zero_and_live_ones_random(qtype):
    rows, cols = np.arange(32) % 2 == 0, np.arange(512) % 128 < 64  # a head of 64 live in every 128
    values = quants.dequantize(
        random_blocks(qtype, 32, 512, 1.0, np.random.default_rng(2), live_mask(qtype, rows, cols)), qtype
    )
    assert (values[~rows] == 0).all() and (values[:, ~cols] == 0).all()
    assert values[np.ix_(rows, cols)].std() == pytest.approx(1.0, rel=0.05)


def test_a_partly_live_sub_block_is_refused():
    with pytest.raises(ValueError, match="partly live"):
        live_mask(T.Q4_K, np.ones(4, bool), np.arange(256) < 40)
    with pytest.raises(ValueError, match="multiple of 256"):
        random_blocks(T.Q4_K, 4, 100, 1.0, np.random.default_rng(0))
