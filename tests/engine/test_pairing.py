"""Which draft a target gets (engine/pairing.choose_draft), from headers only: a target that carries MTP (NextN)
layers drafts with them unless a draft is named or stored, and `mtp` asked of a target without usable ones is
refused with the reason."""

import pytest

from ollama_spec.decoding.proposer_table import MTP
from ollama_spec.engine.pairing import ALONE, AUTO_PICK, NAMED, STORED, choose_draft, mtp_problem
from ollama_spec.errors import IncompatibleDraft
from ollama_spec.models.resolve import resolve_model
from tests.builders.mtp import build_mtp_target
from tests.stores import variant


@pytest.fixture
def mtp_store(store_copy):
    build_mtp_target(store_copy)
    return store_copy


def choose(store, target, named=None, **kwargs):
    return choose_draft(resolve_model(target, str(store)), named, models_dir=str(store), **kwargs)


def test_a_target_with_nextn_layers_drafts_with_them_by_default(mtp_store):
    for named, auto_by_default in ((None, False), (None, True), ("auto", False)):
        choice = choose(mtp_store, "mtp-target", named, auto_by_default=auto_by_default)
        assert (choice.model, choice.source, choice.how, choice.mtp) == (None, MTP, AUTO_PICK, True)
        assert "its own MTP (NextN) layers" in choice.why
    named = choose(mtp_store, "mtp-target", "MTP", said="--pair mtp-target=mtp")
    assert (named.source, named.how, named.mtp) == (MTP, NAMED, True)
    assert named.why == "--pair mtp-target=mtp: the target's own MTP (NextN) layers"


def test_a_named_or_stored_draft_comes_before_the_mtp_layers(mtp_store):
    choice = choose(mtp_store, "mtp-target", "tiny-draft")
    assert (choice.model.name, choice.source, choice.mtp) == ("tiny-draft:latest", None, False)
    variant(mtp_store, "mtp-drafted", base="mtp-target", extra=[("draft", "tiny-draft")])
    stored = choose(mtp_store, "mtp-drafted")
    assert (stored.how, stored.mtp) == (STORED, False)


def test_mtp_asked_of_a_target_without_nextn_layers_is_refused_with_the_reason(tiny_store):
    with pytest.raises(IncompatibleDraft) as refused:
        choose(tiny_store, "tiny-target", "mtp", said="--draft mtp")
    assert str(refused.value) == (
        "--draft mtp: tiny-target:latest has no MTP (NextN) layers to draft with (GLM-4.x and DeepSeek V3 "
        "GGUFs ship them); name a draft model, or --draft ngram"
    )
    assert choose(tiny_store, "tiny-target").how == ALONE  # no NextN layers: nothing changes by default


def test_nextn_layers_llama_cpp_cannot_draft_with_are_not_chosen(tmp_path):
    from tests.builders.recurrent import write_mamba_gguf

    path = tmp_path / "mamba.gguf"
    write_mamba_gguf(path)
    target = resolve_model(str(path))
    assert "no MTP (NextN) layers" in mtp_problem(target)
    info = target.info
    info.metadata[f"{info.architecture}.nextn_predict_layers"] = 1  # as a header that says it has one
    assert info.nextn_layers == 1
    assert mtp_problem(target) == "llama.cpp has no MTP draft graph for mamba.gguf's architecture (mamba)"
    assert choose_draft(target, None).how == ALONE


def test_a_hybrid_target_s_nextn_layers_are_refused_as_a_head_is(mtp_store):
    from dataclasses import replace

    target = resolve_model("mtp-target", str(mtp_store))
    hybrid = replace(target.info, architecture="qwen35", metadata={"qwen35.nextn_predict_layers": 1})
    qwen = replace(target, info=hybrid)
    assert "is a recurrent or hybrid model: its cache cannot be cut back after each step" in mtp_problem(qwen)
    assert choose_draft(qwen, None).how == ALONE
    with pytest.raises(IncompatibleDraft, match="--draft mtp: mtp-target:latest is a recurrent or hybrid"):
        choose_draft(qwen, "mtp", said="--draft mtp")
