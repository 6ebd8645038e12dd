"""EAGLE-3 heads against their targets: what a head reads, and the heads refused with their reason."""

from __future__ import annotations

import pytest

from ollama_spec.models.compat import check_compatibility
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.models.heads import head_facts, head_problems
from ollama_spec.models.resolve import resolve_model
from tests.builders.heads import converted_head, rewritten
from tests.builders.recurrent import write_mamba_gguf
from tests.builders.variants import build_padded_target


@pytest.fixture(scope="module")
def head(tiny_store, tmp_path_factory):
    return converted_head(tiny_store, tmp_path_factory.mktemp("heads") / "head.gguf", draft_vocab=300)


@pytest.fixture(scope="module")
def target(tiny_store):
    return resolve_model("tiny-target", str(tiny_store)).info


def problems(target, path):
    return check_compatibility(target, read_model_info(path)).problems


def test_a_head_says_what_it_reads(head, target):
    facts = head_facts(read_model_info(head))
    assert facts.target_layers == (2, 2, 1) and facts.target_hidden_size == 64
    assert facts.draft_vocab_size == 300 and facts.has_d2t and not facts.own_embeddings and facts.own_output
    assert facts.describe() == (
        "reads target layers [2, 2, 1], 64 wide; 300-token draft vocabulary (d2t); converted for tiny-target"
    )
    assert facts.made_for == "tiny-target" and facts.made_for_model(target)
    assert problems(target, head) == ()
    assert head_facts(target) is None and head_problems(target, target) == []


def test_a_head_for_another_width_is_refused(head, target, tmp_path):
    other = rewritten(head, tmp_path / "wide.gguf", eagle3__target_hidden_size=4096)
    assert problems(target, other) == (
        "the head was made for a target 4096 wide; this target is 64 wide (embedding_length)",
    )


def test_a_head_for_a_deeper_target_is_refused(head, target, tmp_path):
    deep = rewritten(head, tmp_path / "deep.gguf", eagle3__target_layers=[2, 16, 29])
    assert problems(target, deep) == (
        "the head reads target layers [2, 16, 29] but the target has 4 layers: it was made for a deeper model",
    )
    # the final pre-norm state (layer = n_layer) is a layer a head may read
    assert problems(target, rewritten(head, tmp_path / "last.gguf", eagle3__target_layers=[1, 2, 4])) == ()


def test_a_head_with_two_target_layers_is_refused(head, target, tmp_path):
    two = rewritten(head, tmp_path / "two.gguf", eagle3__target_layers=[1, 2])
    assert problems(target, two) == ("the head reads 2 target layers [1, 2]; an EAGLE-3 head reads exactly 3",)


def test_a_head_for_another_vocabulary_is_refused(head, tiny_store, store_copy, tmp_path):
    alien = resolve_model("tiny-alien", str(tiny_store)).info
    assert "vocab sizes 1024 vs 512 differ by more than 128" in problems(alien, head)
    # a vocabulary llama.cpp's rules let a draft model use (64 padding tokens more) but whose size the
    # head's output rows do not match
    padded = resolve_model(build_padded_target(store_copy), str(store_copy)).info
    full = converted_head(tiny_store, tmp_path / "full.gguf")
    assert problems(padded, full) == ("the head's output has 512 rows and no d2t map; the target has 576 tokens",)
    assert problems(padded, head) == ()  # with d2t, its 300 ids are all below 512
    wider = converted_head(store_copy, tmp_path / "wider.gguf", "tiny-padded", draft_vocab=300, target_vocab=576)
    target = resolve_model("tiny-target", str(tiny_store)).info
    assert any(p.startswith("the head's d2t map names token 57") for p in problems(target, wider))


def test_a_head_with_a_recurrent_target_is_refused(head, tmp_path):
    mamba = read_model_info(write_mamba_gguf(tmp_path / "mamba.gguf"))
    assert any("recurrent model (mamba)" in p for p in problems(mamba, head))


def test_a_head_is_no_target(head, target):
    assert "the target is an EAGLE-3 head" in problems(read_model_info(head), head)[0]


def test_a_head_cannot_be_the_target(head):
    from ollama_spec.errors import UnusableModel
    from ollama_spec.models.usable import require_usable

    with pytest.raises(UnusableModel, match="cannot be the target: it has an EAGLE-3 head's single layer"):
        require_usable("head", read_model_info(head), "target", lambda name: True)
    require_usable("head", read_model_info(head), "draft", lambda name: True)
