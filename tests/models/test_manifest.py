"""Manifests as Ollama writes and reads them, and any bytes in one: a clean answer or a one-line error."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ollama_spec.errors import BlobError, InvalidManifest, ModelNotFound, NotGGUF, StoreUnreadable
from ollama_spec.models.blobs import verify_blob
from ollama_spec.models.manifest import MAX_MANIFEST_BYTES
from ollama_spec.models.store import BrokenModel, Store, StoredModel, blob_path, find_store_root
from tests.models.test_store import _rewrite_layers, manifest_of


def test_manifest_with_bad_digest_is_refused(store_copy):
    path = manifest_of(store_copy, "tiny-draft")
    doc = json.loads(path.read_text())
    doc["layers"][0]["digest"] = "sha256:../../../escape"
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidManifest, match="invalid layer digest 'sha256:../../../escape'"):
        Store(find_store_root(store_copy)).resolve("tiny-draft")


def test_invalid_manifest_json(store_copy):
    manifest_of(store_copy, "tiny-draft").write_text("{not json")
    with pytest.raises(InvalidManifest, match="is not valid JSON"):
        Store(find_store_root(store_copy)).resolve("tiny-draft")


# --- any bytes in a manifest end in a clean answer or a clean error ----------------------------
JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)
LAYER_VALUES = {
    "mediaType": st.sampled_from(["application/vnd.ollama.image.model", "application/vnd.ollama.image.params"]) | JSON,
    "digest": st.just("sha256:" + "a" * 64) | JSON,
    "size": st.integers(-10, 2**70) | JSON,
}


def _outcome(store: Store, name: str) -> str:
    try:
        model = store.resolve(name)
        model.params(), model.text_layer("template")
        model.model_info(read_vocab=False)
    except (InvalidManifest, BlobError, NotGGUF, ModelNotFound, StoreUnreadable) as exc:
        message = str(exc)
        assert "\n" not in message and len(message) < 500, message
        return type(exc).__name__
    except Exception as exc:  # noqa: BLE001 - the property: nothing else ever escapes
        from ollama_spec.errors import CorruptGGUF

        assert isinstance(exc, CorruptGGUF), repr(exc)
        return "CorruptGGUF"
    return "ok"


@given(content=st.binary(max_size=300) | JSON.map(lambda doc: json.dumps(doc).encode()))
def test_any_manifest_content(store_copy, content):
    manifest_of(store_copy, "tiny-draft").write_bytes(content)
    store = Store(find_store_root(store_copy))
    _outcome(store, "tiny-draft")
    listed = {m.name: m for m in store.models()}
    assert isinstance(listed["tiny-draft:latest"], (StoredModel, BrokenModel))
    assert isinstance(listed["tiny-target:latest"], StoredModel)


@given(st.data())
def test_any_layer_list(tiny_store, store_copy, data):
    doc = json.loads(manifest_of(tiny_store, "tiny-draft").read_text())
    path = manifest_of(store_copy, "tiny-draft")
    layers = doc["layers"]
    for _ in range(data.draw(st.integers(1, 3))):
        layer = layers[data.draw(st.integers(0, len(layers) - 1))]
        field = data.draw(st.sampled_from(sorted(LAYER_VALUES)))
        layer[field] = data.draw(LAYER_VALUES[field])
    doc["config"] = data.draw(st.just(doc["config"]) | JSON)
    path.write_text(json.dumps(doc))
    _outcome(Store(find_store_root(store_copy)), "tiny-draft")


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is not valid JSON"),
        (b"\xff\xfe", "is not valid JSON"),
        (b"[" * 100_000 + b"]" * 100_000, r"is not valid JSON \(nested too deeply\)"),
        (b"[]", "is not a manifest with a list of layers"),
        (b'{"layers": {"a": 1}}', "is not a manifest with a list of layers"),
        (b'{"schemaVersion": 2, "layers": [1]}', "has a layer 1 that is not an object"),
        (b'{"schemaVersion": 2, "layers": [{"digest": "sha256:x", "size": 1}]}', "has a layer 1 without a media type"),
        (
            b'{"schemaVersion": 2, "layers": [{"mediaType": "m", "size": -5}]}',
            "has a layer 1 whose size -5 is not a byte",
        ),
        (
            b'{"schemaVersion": 2, "layers": [{"mediaType": "m", "size": 1.5}]}',
            "has a layer 1 whose size 1.5 is not a byte count",
        ),
        (
            b'{"schemaVersion": 2, "layers": [{"mediaType": "m", "size": true}]}',
            "has a layer 1 whose size True is not a byte count",
        ),
        (
            b'{"schemaVersion": 2, "layers": [{"mediaType": "m", "size": 1e999}]}',
            "has a layer 1 whose size inf is not a byte count",
        ),
        (
            b'{"schemaVersion": 2, "layers": [{"mediaType": "m", "size": 1, "digest": 7}]}',
            "has an invalid layer digest 7: expected",
        ),
    ],
)
def test_crafted_manifests(store_copy, content, message):
    manifest_of(store_copy, "tiny-draft").write_bytes(content)
    with pytest.raises(InvalidManifest, match=f"^tiny-draft:latest: its manifest .*latest {message}"):
        Store(find_store_root(store_copy)).resolve("tiny-draft")


def test_huge_manifest_is_not_read_whole(store_copy):
    path = manifest_of(store_copy, "tiny-draft")
    with open(path, "wb") as f:
        f.truncate(4 << 30)  # sparse: 4 GiB of zeros
    with pytest.raises(
        InvalidManifest, match=f"is larger than {MAX_MANIFEST_BYTES >> 20}.0 MiB; a manifest is a few KB"
    ):
        Store(find_store_root(store_copy)).resolve("tiny-draft")


def test_manifests_ollama_reads_are_read(store_copy):
    """No schemaVersion (Ollama never checks it) and `sha256-<hex>` digests (Ollama's BlobsPath takes them)."""
    path = manifest_of(store_copy, "tiny-draft")
    doc = json.loads(path.read_text())
    del doc["schemaVersion"]
    doc["layers"][0]["digest"] = doc["layers"][0]["digest"].replace(":", "-")
    path.write_text(json.dumps(doc))
    model = Store(find_store_root(store_copy)).resolve("tiny-draft")
    assert model.layers[0].digest.startswith("sha256:")
    assert model.gguf_path == blob_path(store_copy, doc["layers"][0]["digest"])
    verify_blob(model.gguf_path, model.layers[0])


def test_the_last_model_layer_wins_as_in_ollama(store_copy):
    store = Store(find_store_root(store_copy))
    own_blob = store.resolve("tiny-target").gguf_path
    alien = json.loads(manifest_of(store_copy, "tiny-alien").read_text())["layers"][0]
    _rewrite_layers(store_copy, "tiny-target", lambda layers: [alien, *layers])  # two model layers
    model = store.resolve("tiny-target")
    assert [layer.kind for layer in model.layers][:2] == ["model", "model"]
    assert model.gguf_path == own_blob
