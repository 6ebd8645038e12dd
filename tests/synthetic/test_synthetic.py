"""The synthetic model family: deterministic, loadable, laid out like Ollama's store."""

import hashlib
import json

import pytest

from ollama_spec.synthetic.tokenizer import CONTROL, build_vocabulary


@pytest.mark.parametrize("size, merges", [(512, 200), (4096, 100), (32000, 10)])
def test_vocabulary_reaches_any_size(size, merges):
    vocab = build_vocabulary(size, merges)
    assert vocab.size == size and len(set(vocab.tokens)) == size
    assert vocab.token_types[-5:] == (CONTROL,) * 5
    # every merge joins two existing tokens into one that exists
    tokens = set(vocab.tokens)
    assert all(a in tokens and b in tokens and a + b in tokens for a, b in (m.split(" ") for m in vocab.merges))


def test_vocabulary_is_deterministic():
    assert build_vocabulary(2048, 600) == build_vocabulary(2048, 600)


def test_store_manifests_have_correct_digests_and_sizes(tiny_store):
    for manifest in (tiny_store / "manifests").rglob("latest"):
        doc = json.loads(manifest.read_text())
        assert doc["schemaVersion"] == 2
        assert doc["mediaType"] == "application/vnd.docker.distribution.manifest.v2+json"
        for layer in doc["layers"] + [doc["config"]]:
            blob = tiny_store / "blobs" / layer["digest"].replace(":", "-")
            data = blob.read_bytes()
            assert len(data) == layer["size"]
            assert "sha256:" + hashlib.sha256(data).hexdigest() == layer["digest"]


def test_draft_is_the_targets_first_layer(tiny_models):
    target, draft = tiny_models
    assert draft.info.block_count == 1 and target.info.block_count == 4
    target_tensors = {t.name: t for t in target.info.tensors}
    for tensor in draft.info.tensors:
        twin = target_tensors[tensor.name]
        with open(target.path, "rb") as a, open(draft.path, "rb") as b:
            a.seek(target.info.data_offset + twin.offset)
            b.seek(draft.info.data_offset + tensor.offset)
            assert a.read(tensor.n_bytes) == b.read(tensor.n_bytes), tensor.name


def test_rebuilding_gives_identical_blobs(tiny_store, tmp_path):
    from ollama_spec.synthetic import build_pair_store

    build_pair_store(tmp_path, "tiny")
    assert sorted(p.name for p in (tmp_path / "blobs").iterdir()) == sorted(
        p.name for p in (tiny_store / "blobs").iterdir()
    )


def test_a_pair_says_each_layer_it_generates_and_writes(tmp_path):
    """Issue 42: the demo target's 13 layers take 20 s or more to make and write; the build says each one."""
    from ollama_spec.synthetic import build_pair_store

    notes = []
    build_pair_store(tmp_path, "tiny", progress=notes.append)
    assert [n for n in notes if n.startswith("generating tiny-target's")] == [
        f"generating tiny-target's weights: layer {i} of 4" for i in range(1, 5)
    ]
    assert [n for n in notes if n.startswith("writing tiny-target:q8_0:")] == [
        "writing tiny-target:q8_0: 4 layers, Q8_0"
    ] + [f"writing tiny-target:q8_0: layer {i} of 4, Q8_0" for i in range(1, 5)]
    assert "writing tiny-draft: layer 1 of 1, F32" in notes
