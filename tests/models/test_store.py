"""What a model store holds: names resolved to manifests and blobs, blobs, manifests and layers
that are missing, corrupt or not GGUF, what `list` shows of a broken store, and that no command
writes to the store. Where the store is found and whether it can be read: test_store_root.py."""

import json
import os
import re
import shutil

import pytest

from ollama_spec.errors import BlobError, InvalidManifest, ModelNotFound, NotGGUF
from ollama_spec.models.blobs import verify_blob
from ollama_spec.models.store import (
    Store,
    StoredModel,
    StoreRoot,
    blob_path,
    find_store_root,
)


def manifest_of(root, model):
    return root / "manifests" / "registry.ollama.ai" / "library" / model / "latest"


def test_resolve_is_case_insensitive(tiny_store):
    store = Store(find_store_root(tiny_store))
    model = store.resolve("Tiny-Target:LATEST")
    assert model.gguf_path.name.startswith("sha256-")
    assert [layer.kind for layer in model.layers] == ["model", "template", "license", "params"]
    assert model.params()["stop"] == ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    assert "<|start_header_id|>" in model.text_layer("template")


def test_unknown_model_suggests_close_names(tiny_store):
    with pytest.raises(ModelNotFound, match="model 'tiny-targt' not found .*did you mean tiny-target:latest"):
        Store(find_store_root(tiny_store)).resolve("tiny-targt")


def test_unknown_model_suggests_pull(tiny_store):
    with pytest.raises(ModelNotFound, match="pull it with 'ollama-spec pull llama3.1:70b'"):
        Store(find_store_root(tiny_store)).resolve("llama3.1:70b")


def test_list_models(tiny_store):
    names = [m.name for m in Store(find_store_root(tiny_store)).models()]
    assert names == [
        "tiny-alien:latest",
        "tiny-draft:latest",
        "tiny-draft:q4_0",
        "tiny-draft:q8_0",
        "tiny-target:latest",
        "tiny-target:q4_0",
        "tiny-target:q8_0",
    ]


@pytest.mark.parametrize("digest", ["sha256:../../etc/passwd", "md5:abc", "sha256:" + "A" * 64, "sha256:" + "a" * 63])
def test_bad_digests_never_become_paths(tmp_path, digest):
    with pytest.raises(InvalidManifest, match="invalid layer digest"):
        blob_path(tmp_path, digest)


def test_missing_blob(store_copy):
    store = Store(find_store_root(store_copy))
    model = store.resolve("tiny-draft")
    blob_path(store_copy, model.layers[0].digest).unlink()
    with pytest.raises(BlobError, match="is missing"):
        model.gguf_path


def test_size_mismatch(store_copy):
    store = Store(find_store_root(store_copy))
    model = store.resolve("tiny-draft")
    with open(blob_path(store_copy, model.layers[0].digest), "ab") as f:
        f.write(b"x")
    with pytest.raises(BlobError, match="manifest says"):
        model.gguf_path


def test_verify_catches_corruption(store_copy):
    model = Store(find_store_root(store_copy)).resolve("tiny-draft")
    layer = model.layers[0]
    path = blob_path(store_copy, layer.digest)
    verify_blob(path, layer)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(BlobError, match="does not match its digest"):
        verify_blob(path, layer)


def _rewrite_layers(store_copy, model, mutate, config=None):
    path = manifest_of(store_copy, model)
    doc = json.loads(path.read_text())
    doc["layers"] = mutate(doc["layers"])
    if config is not None:
        from ollama_spec.synthetic.layout import add_blob

        digest, size = add_blob(store_copy, json.dumps(config).encode())
        doc["config"] = {"mediaType": "application/vnd.docker.container.image.v1+json", "digest": digest, "size": size}
    path.write_text(json.dumps(doc))


def test_safetensors_model_is_not_gguf(store_copy):
    def to_tensors(layers):
        return [
            dict(l, mediaType="application/vnd.ollama.image.tensor") if l["mediaType"].endswith(".model") else l
            for l in layers
        ]

    _rewrite_layers(store_copy, "tiny-draft", to_tensors)
    model = Store(find_store_root(store_copy)).resolve("tiny-draft")
    with pytest.raises(NotGGUF, match="tiny-draft:latest is not a GGUF model: it is stored as safetensors"):
        model.gguf_path


def test_cloud_model_is_not_gguf(store_copy):
    _rewrite_layers(
        store_copy,
        "tiny-draft",
        lambda layers: layers[1:],
        config={"remote_host": "https://ollama.com:443", "remote_model": "gpt-oss:120b"},
    )
    with pytest.raises(NotGGUF, match="it is an Ollama cloud model"):
        Store(find_store_root(store_copy)).resolve("tiny-draft").gguf_path


def test_non_gguf_model_blob(store_copy):
    from ollama_spec.synthetic.layout import add_blob

    digest, size = add_blob(store_copy, b"PK\x03\x04 not a gguf")
    _rewrite_layers(store_copy, "tiny-draft", lambda layers: [dict(layers[0], digest=digest, size=size)] + layers[1:])
    with pytest.raises(NotGGUF, match="its model blob .* is not GGUF"):
        Store(find_store_root(store_copy)).resolve("tiny-draft").gguf_path


def test_store_is_never_written(tiny_store, invoke, tmp_path):
    """Every command that reads the store leaves each file and folder as it was (no new ones either)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The quick brown fox\n", encoding="utf-8")
    before = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in [tiny_store, *tiny_store.rglob("*")]}
    for args in (
        ["list"],
        ["show", "tiny-target", "--verify"],
        ["pair", "tiny-target", "tiny-draft"],
        ["check", "tiny-target", "-d", "tiny-draft"],
        ["generate", "tiny-target", "-d", "tiny-draft", "hi", "--threads", "1", "-n", "8", "--compare", "--stats"],
        [
            "bench",
            "tiny-target",
            "-d",
            "tiny-draft",
            "--threads",
            "1",
            "-n",
            "8",
            "--runs",
            "1",
            "-k",
            "2",
            "--no-warmup",
            "--prompts",
            prompts,
            "--out",
            tmp_path / "results",
        ],
    ):
        result = invoke(*args, "--models-dir", tiny_store)
        assert result.exit_code == 0, (args, result.output)
    after = {p: (p.stat().st_mtime_ns, p.stat().st_size) for p in [tiny_store, *tiny_store.rglob("*")]}
    assert before == after
    assert (tmp_path / "results" / "results.json").is_file()  # bench wrote where it was told


def add_manifest(root, *parts):
    """A copy of tiny-draft's manifest at manifests/<parts>, the path written out by hand."""
    path = root.joinpath("manifests", *parts)
    path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(manifest_of(root, "tiny-draft"), path)


def test_models_under_other_namespaces_and_hosts_resolve(store_copy, invoke):
    add_manifest(store_copy, "registry.ollama.ai", "someone", "tiny", "latest")
    add_manifest(store_copy, "hf.co", "someone", "Tiny-GGUF", "Q4_K_M")
    add_manifest(store_copy, "localhost:11434", "team", "tiny", "v1")
    store = Store(find_store_root(store_copy))
    draft_blob = store.resolve("tiny-draft").gguf_path
    for name in (
        "someone/tiny",
        "someone/tiny:latest",
        "registry.ollama.ai/someone/tiny",
        "hf.co/someone/Tiny-GGUF:Q4_K_M",
        "HF.CO/someone/tiny-gguf:q4_k_m",
        "https://hf.co/someone/Tiny-GGUF:Q4_K_M",
        "localhost:11434/team/tiny:v1",
        "http://localhost:11434/team/tiny:v1",
    ):
        assert store.resolve(name).gguf_path == draft_blob, name
    for name in ("hf.co/someone/Tiny-GGUF", "localhost:11434/team/tiny", "tiny", "someone/tiny:v1", "other/tiny"):
        with pytest.raises(ModelNotFound):
            store.resolve(name)
    listed = invoke("list", "--models-dir", store_copy)
    names = {line.split()[0] for line in listed.stdout.splitlines()[1:]}
    assert {"someone/tiny:latest", "hf.co/someone/Tiny-GGUF:Q4_K_M", "localhost:11434/team/tiny:v1"} <= names
    result = invoke(
        "generate",
        "hf.co/someone/Tiny-GGUF:Q4_K_M",
        "hi",
        "--no-check",
        "--threads",
        "1",
        "-n",
        "2",
        "--json",
        "--models-dir",
        store_copy,
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["target"] == "hf.co/someone/Tiny-GGUF:Q4_K_M"


def test_legacy_colon_blob_names_are_found(store_copy):
    model = Store(find_store_root(store_copy)).resolve("tiny-draft")
    dashed = blob_path(store_copy, model.layers[0].digest)
    colon = dashed.with_name(dashed.name.replace("sha256-", "sha256:"))
    dashed.rename(colon)
    assert model.gguf_path == colon


def test_list_shows_a_broken_model_without_failing(store_copy, invoke):
    model = Store(find_store_root(store_copy)).resolve("tiny-draft")
    blob_path(store_copy, model.layers[0].digest).unlink()
    result = invoke("list", "--models-dir", store_copy)
    assert result.exit_code == 0
    line = next(l for l in result.stdout.splitlines() if l.startswith("tiny-draft"))
    assert "is missing" in line


@pytest.mark.parametrize(
    "params, message",
    [
        ("[1, 2]", "is not a JSON object"),
        ('{"stop": "abc"}', "has stop 'abc': expected a list of strings"),
        ('{"num_ctx": "4096"}', "has num_ctx '4096': expected a whole number"),
        ('{"num_ctx": 1.5}', "has num_ctx 1.5: expected a whole number"),
        ('{"temperature": NaN}', "has temperature nan: expected a number"),
        ('{"seed": true}', "has seed True: expected a whole number"),
        ("{" * 50_000, "is not valid JSON"),
    ],
)
def test_params_layer_of_the_wrong_shape(store_copy, params, message):
    from ollama_spec.synthetic.layout import add_blob

    digest, size = add_blob(store_copy, params.encode())
    _rewrite_layers(
        store_copy,
        "tiny-draft",
        lambda layers: [dict(l, digest=digest, size=size) if l["mediaType"].endswith("params") else l for l in layers],
    )
    with pytest.raises(InvalidManifest, match=f"^tiny-draft:latest: its params layer {re.escape(message)}"):
        Store(find_store_root(store_copy)).resolve("tiny-draft").params()


def test_list_names_broken_manifests_and_keeps_the_healthy_ones(store_copy, invoke):
    manifest_of(store_copy, "tiny-draft").write_text('{"schemaVersion": 2, "layers": [{"mediaType": "m", "size": -5}]}')
    manifest_of(store_copy, "tiny-alien").write_bytes(b"\x00" * 10)
    result = invoke("list", "--models-dir", store_copy)
    assert result.exit_code == 0
    rows = {line.split()[0]: line for line in result.stdout.splitlines()[1:]}
    assert set(rows) == {
        "tiny-alien:latest",
        "tiny-draft:latest",
        "tiny-target:latest",
        "tiny-draft:q4_0",
        "tiny-draft:q8_0",
        "tiny-target:q4_0",
        "tiny-target:q8_0",
    }
    assert "?" in rows["tiny-draft:latest"] and "whose size -5 is not a byte count" in rows["tiny-draft:latest"]
    assert "-5 B" not in result.stdout and "is not valid JSON" in rows["tiny-alien:latest"]
    assert "F32" in rows["tiny-target:latest"]
    data = json.loads(invoke("list", "--models-dir", store_copy, "--json").stdout)
    broken = next(m for m in data["models"] if m["name"] == "tiny-draft:latest")
    assert broken["size"] is None and broken["error"].startswith("its manifest ")


def test_list_survives_a_corrupt_gguf_and_an_unreadable_blob(store_copy, invoke, tmp_path):
    from gguf import GGUFValueType

    from ollama_spec.synthetic.layout import add_blob
    from tests.gguf_bytes import array, header

    nested = header(array("deep", GGUFValueType.ARRAY, 1, b"\x09\0\0\0\1\0\0\0\0\0\0\0" * 50_000))
    digest, size = add_blob(store_copy, nested)
    _rewrite_layers(store_copy, "tiny-draft", lambda layers: [dict(layers[0], digest=digest, size=size)] + layers[1:])
    result = invoke("list", "--models-dir", store_copy)
    assert result.exit_code == 0
    line = next(l for l in result.stdout.splitlines() if l.startswith("tiny-draft"))
    assert "has an array of arrays under key 'deep'" in line
    shown = invoke("show", "tiny-draft", "--models-dir", store_copy)
    assert shown.exit_code == 1 and shown.output.startswith("Error: tiny-draft:latest: ")
    assert "has an array of arrays" in shown.output and shown.output.count("\n") == 1


def test_list_skips_odd_names_and_what_is_not_a_file(store_copy, invoke):
    library = manifest_of(store_copy, "tiny-target").parent.parent
    for odd in ("new\nline", os.fsdecode(b"bad\xff")):
        (library / odd).mkdir()
        (library / odd / "latest").write_text("{")
    os.mkfifo(library / "tiny-target" / "fifo")  # reading it would block
    (library / "tiny-target" / "loop").symlink_to("loop")
    result = invoke("list", "--models-dir", store_copy)
    assert result.exit_code == 0
    names = [line.split()[0] for line in result.stdout.splitlines()[1:]]
    # names Ollama cannot hold are no models, as in its manifest listing
    assert names == [
        "tiny-alien:latest",
        "tiny-draft:latest",
        "tiny-draft:q4_0",
        "tiny-draft:q8_0",
        "tiny-target:latest",
        "tiny-target:q4_0",
        "tiny-target:q8_0",
    ]
    assert len(result.stdout.splitlines()) == 8


# --- audit fixes: Ollama's own reading of manifests and names -------------------------------------
def test_list_skips_what_ollama_does_not_take_for_a_model(store_copy, invoke):
    good = manifest_of(store_copy, "tiny-draft")
    for odd in (".DS_Store", "latest.tmp", "-partial"):
        shutil.copy(good, good.parent / odd)
    add_manifest(store_copy, "registry.ollama.ai", "library", "bad name", "latest")
    names = [m.name for m in Store(find_store_root(store_copy)).models()]
    assert names == [
        "tiny-alien:latest",
        "tiny-draft:latest",
        "tiny-draft:q4_0",
        "tiny-draft:q8_0",
        "tiny-target:latest",
        "tiny-target:q4_0",
        "tiny-target:q8_0",
    ]
    shown = invoke("show", "bad", "--models-dir", store_copy)
    assert shown.exit_code == 1 and "did you mean" not in shown.output


def test_a_missing_config_blob_is_a_config_problem(store_copy):
    store = Store(find_store_root(store_copy))
    model = store.resolve("tiny-draft")
    assert model.config_problem() is None and model.config_layer is not None
    blob_path(store_copy, model.config_layer.digest).unlink()
    assert "is missing" in store.resolve("tiny-draft").config_problem()


def test_names_resolve_to_their_stored_spelling(tiny_store):
    assert Store(find_store_root(tiny_store)).resolve("TINY-Target:LATEST").name == "tiny-target:latest"


def test_a_model_deleted_while_the_store_is_listed_is_left_out(store_copy):
    """The listing found every manifest, then a delete took one before it was read: it is left out, not listed
    as broken; resolving it is ModelNotFound."""
    store = Store(StoreRoot(store_copy, "test"))
    listing = store.models()
    first = next(listing)
    gone = store_copy / "manifests/registry.ollama.ai/library/tiny-target/latest"
    gone.unlink()
    rest = list(listing)
    assert first.name != "tiny-target:latest" and all(isinstance(m, StoredModel) for m in [first, *rest])
    assert "tiny-target:latest" not in {m.name for m in rest} and "tiny-target:q4_0" in {m.name for m in rest}
    with pytest.raises(ModelNotFound):
        store.resolve("tiny-target")
