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
