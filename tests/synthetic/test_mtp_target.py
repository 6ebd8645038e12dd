"""The synthetic MTP target: llama.cpp (through llama-cpp-python's own bindings) loads its NextN layer,
hands the target's pre-norm states to an MTP context over the same model, and drafts from them."""

import ctypes

import llama_cpp
import numpy as np
import pytest
from llama_cpp import llama_cpp_ext

from ollama_spec.synthetic.mtp_target import MtpShape, write_mtp_target

SHAPE = MtpShape()


@pytest.fixture(scope="module")
def mtp_model(tiny_models, tmp_path_factory):
    path = write_mtp_target(tmp_path_factory.mktemp("mtp") / "mtp-target.gguf", tiny_models[0].path, SHAPE)
    llama_cpp.llama_backend_init()
    params = llama_cpp.llama_model_default_params()
    params.load_mtp = True
    model = llama_cpp.llama_model_load_from_file(str(path).encode(), params)
    assert model, "llama.cpp did not load the synthetic glm4moe target"
    yield model
    llama_cpp.llama_model_free(model)


def context(model, **fields):
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_threads, params.n_threads_batch = 256, 1, 1
    for name, value in fields.items():
        setattr(params, name, value)
    return llama_cpp.llama_init_from_model(model, params)


def test_the_nextn_layer_is_loaded_apart_from_the_trunk(mtp_model):
    assert llama_cpp.llama_model_n_layer_nextn(mtp_model) == 1
    assert llama_cpp.llama_model_n_layer(mtp_model) == SHAPE.n_layer


def test_an_mtp_context_drafts_from_the_targets_state(mtp_model):
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(mtp_model))
    target = context(mtp_model)
    mtp = context(mtp_model, ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP, ctx_other=target)
    assert target and mtp
    try:
        llama_cpp_ext.llama_set_embeddings_nextn(target, True, False)
        tokens = (llama_cpp.llama_token * 4)(1, 2, 3, 4)
        assert llama_cpp.llama_decode(target, llama_cpp.llama_batch_get_one(tokens, 4)) == 0
        h = llama_cpp_ext.llama_get_embeddings_nextn(target)
        assert h, "the target kept no pre-norm state for the NextN layer"
        state = np.ctypeslib.as_array(ctypes.cast(h, ctypes.POINTER(ctypes.c_float)), shape=(SHAPE.n_embd,)).copy()
        assert np.isfinite(state).all() and np.abs(state).sum() > 0

        batch = llama_cpp.llama_batch_init(1, SHAPE.n_embd, 1)
        token_ids = (llama_cpp.llama_token * 1)(5)
        batch.token = token_ids  # an MTP step reads a token and an embedding row together
        batch.n_tokens, batch.pos[0], batch.n_seq_id[0], batch.seq_id[0][0], batch.logits[0] = 1, 4, 1, 0, 1
        np.ctypeslib.as_array(batch.embd, shape=(SHAPE.n_embd,))[:] = state
        try:
            assert llama_cpp.llama_decode(mtp, batch) == 0
            logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(mtp, 0), shape=(n_vocab,))
            assert np.isfinite(logits).all() and logits.std() > 0
        finally:
            batch.token = None  # ours: llama_batch_free must not free it
            llama_cpp.llama_batch_free(batch)
    finally:
        llama_cpp.llama_free(mtp)
        llama_cpp.llama_free(target)


def test_a_target_without_nextn_layers_gets_no_mtp_context(tiny_models):
    model = llama_cpp.llama_model_load_from_file(
        str(tiny_models[0].path).encode(), llama_cpp.llama_model_default_params()
    )
    try:
        target = context(model)
        assert not context(model, ctx_type=llama_cpp.LLAMA_CONTEXT_TYPE_MTP, ctx_other=target)
        llama_cpp.llama_free(target)
    finally:
        llama_cpp.llama_model_free(model)
