import dataclasses

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants

from ollama_spec.llama.model import LoadedModel, LoadSettings
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.models.resolve import resolve_model
from ollama_spec.synthetic import nested
from ollama_spec.synthetic.nested import NESTED, build_nested_pair, build_nested_store, use_more_bits


def test_q4_k_m_layers_with_more_bits_follow_llama_cpp():
    # llama-quant.cpp, n_layer 32: the first and last 4 layers and every third one between.
    assert [i for i in range(32) if use_more_bits(i, 32)] == [0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30, 31]


def test_the_draft_is_the_targets_own_weights_read_back():
    spec = NESTED["tiny"]
    pair = build_nested_pair(spec)
    t, d = spec.target, spec.draft
    q_target = quants.dequantize(pair.target["blk.0.attn_q.weight"][0], T.Q4_K)
    q_draft = quants.dequantize(pair.draft["blk.0.attn_q.weight"][0], T.Q8_0)
    assert q_target.shape == (t.n_embd, t.n_embd) and q_draft.shape == (d.n_embd, d.n_embd)
    # draft head 0's RoPE pair i sits at pair 2i of target head 0, Q scaled by sqrt(head-size ratio)
    ratio = t.head_dim // d.head_dim
    rows = [ratio * (j - j % 2) + j % 2 for j in range(d.head_dim)]
    expected = q_target[rows, : d.n_embd] / np.sqrt(ratio)
    assert np.abs(q_draft[: d.head_dim] - expected).max() < 0.01 * np.abs(expected).max()
    assert (q_target[:, d.n_embd :] == 0).all()  # the target's extra width never feeds the draft's part
    out_t = quants.dequantize(pair.target["blk.0.attn_output.weight"][0], T.Q4_K)
    assert (out_t[d.n_embd :] == 0).all() and (out_t[:, d.head_dim : t.head_dim] == 0).all()
    assert pair.target["blk.3.ffn_down.weight"][1] == T.Q6_K and pair.target["blk.0.ffn_down.weight"][1] == T.Q4_K


@pytest.fixture(scope="module")
def nested_store(tmp_path_factory, monkeypatch_module):
    root = tmp_path_factory.mktemp("nested")
    exact = dataclasses.replace(
        NESTED["tiny"], residual_scale=0.0, target_name="exact-target:q4_k_m", draft_name="exact-draft:q8_0"
    )
    monkeypatch_module.setitem(nested.NESTED, "exact", exact)
    build_nested_store(root, "tiny")
    build_nested_store(root, "exact")
    return root


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


def test_the_files_have_real_types_and_compatible_vocabularies(nested_store):
    target = read_model_info(resolve_model("nested-target:q4_k_m", str(nested_store)).path)
    draft = read_model_info(resolve_model("nested-draft:q8_0", str(nested_store)).path)
    assert (target.file_type, draft.file_type) == ("Q4_K_M", "Q8_0")
    types = {t.name: t.type_name for t in target.tensors}
    assert types["blk.0.attn_q.weight"] == "Q4_K" and types["output.weight"] == "Q6_K"
    assert {t.type_name for t in draft.tensors if len(t.shape) == 2} == {"Q8_0"}
    assert (target.embedding_length, draft.embedding_length) == (512, 256) and target.vocab_size == draft.vocab_size


def test_without_target_only_updates_the_target_computes_the_draft(nested_store):
    """The nesting (RoPE pairs, Q scale, norms) is exact: only Q8_0 rounding separates the logits."""
    settings = LoadSettings(n_ctx=256, n_threads=1)
    with (
        LoadedModel(resolve_model("exact-target:q4_k_m", str(nested_store)).path, settings) as target,
        LoadedModel(resolve_model("exact-draft:q8_0", str(nested_store)).path, settings) as draft,
    ):
        tokens = target.tokenize("The quick brown fox jumps over the lazy dog, twice.", add_bos=True, special=False)
        lt, ld = target.eval(tokens, logits="all"), draft.eval(tokens, logits="all")
    assert np.abs(lt - ld).max() < 0.1 * lt.std()  # a wrong RoPE placement or scale gives differences of ~1 std
    assert (lt.argmax(1) == ld.argmax(1)).mean() >= 0.9
