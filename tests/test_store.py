import json
import os
import shutil
from pathlib import Path

import pytest

from ollama_spec.errors import BlobError, InvalidManifest, ModelNotFound, NotGGUF, StoreNotFound, StoreUnreadable
from ollama_spec.store import SERVICE_STORE, Store, StoreRoot, blob_path, find_store_root, verify_blob


@pytest.fixture
def store_copy(tiny_store, tmp_path):
    root = tmp_path / "models"
    shutil.copytree(tiny_store, root)
    return root


def manifest_of(root, model):
    return root / "manifests" / "registry.ollama.ai" / "library" / model / "latest"


def test_root_precedence(tmp_path, monkeypatch, isolated_user_paths):
    flag, env, home = tmp_path / "flag", tmp_path / "env", isolated_user_paths / ".ollama" / "models"
    for d in (flag, env, home):
        d.mkdir(parents=True)
    monkeypatch.setenv("OLLAMA_MODELS", str(env))
    assert find_store_root(flag).source == "--models-dir"
    assert find_store_root(None).path == env and find_store_root(None).source == "OLLAMA_MODELS"
    monkeypatch.delenv("OLLAMA_MODELS")
    assert find_store_root(None).path == home


def test_missing_explicit_root_is_an_error(tmp_path):
    with pytest.raises(StoreNotFound, match=r"the model store .*nowhere \(from OLLAMA_MODELS\) does not exist"):
        find_store_root(None, {"OLLAMA_MODELS": str(tmp_path / "nowhere")})


def test_no_store_anywhere_says_what_to_do(tmp_path, monkeypatch):
    import ollama_spec.store as store_module

    monkeypatch.setattr(store_module, "SERVICE_STORE", tmp_path / "no-service-store")
    with pytest.raises(StoreNotFound, match=r"no Ollama model store found .*no-service-store\); pull a model with"):
        find_store_root(None, {})


@pytest.fixture
def service_store(tiny_store, tmp_path, monkeypatch):
    """The Linux service install's store, /usr/share/ollama/.ollama/models, moved into tmp."""
    import ollama_spec.store as store_module

    root = tmp_path / "usr-share-ollama" / ".ollama" / "models"
    shutil.copytree(tiny_store, root)
    monkeypatch.setattr(store_module, "SERVICE_STORE", root)
    return root


def test_the_linux_service_store_is_found_last(service_store, isolated_user_paths, invoke):
    assert SERVICE_STORE == Path("/usr/share/ollama/.ollama/models")  # Ollama's install script
    assert find_store_root(None, {}) == StoreRoot(service_store, "the Ollama service store")
    listed = invoke("list")
    assert listed.exit_code == 0, listed.output
    names = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
    assert names == sorted(names) and {"tiny-alien:latest", "tiny-draft:latest", "tiny-target:latest"} <= set(names)
    generated = invoke("generate", "tiny-target", "hi", "--no-check", "--threads", "1", "-n", "2", "--json")
    assert generated.exit_code == 0, generated.output
    home = isolated_user_paths / ".ollama" / "models"
    home.mkdir(parents=True)
    assert find_store_root(None, {}).path == home  # a user's own store comes first


def test_an_unreadable_service_store_says_group_ollama(service_store, monkeypatch):
    import ollama_spec.store as store_module

    real_listdir = store_module.os.listdir

    def denied(path):
        if Path(path) == service_store:
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(store_module.os, "listdir", denied)
    with pytest.raises(StoreUnreadable) as err:
        find_store_root(None, {})
    assert str(err.value) == (
        f"the model store {service_store} (from the Ollama service store) exists but is not readable by you; "
        "add yourself to group ollama (sudo usermod -aG ollama $USER, then log in again)"
    )


@pytest.mark.skipif(os.geteuid() == 0, reason="root can read anything")
def test_unreadable_root_mentions_group_ollama(tmp_path):
    root = tmp_path / "locked"
    root.mkdir()
    root.chmod(0)
    try:
        with pytest.raises(StoreUnreadable, match="add yourself to group ollama"):
            find_store_root(root)
    finally:
        root.chmod(0o755)


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
    with pytest.raises(ModelNotFound, match="pull it with 'ollama pull llama3.1:70b'"):
        Store(find_store_root(tiny_store)).resolve("llama3.1:70b")


def test_list_models(tiny_store):
    names = [m.name for m in Store(find_store_root(tiny_store)).models()]
    assert names == ["tiny-alien:latest", "tiny-draft:latest", "tiny-draft:q4_0", "tiny-draft:q8_0",
                     "tiny-target:latest", "tiny-target:q4_0", "tiny-target:q8_0"]


@pytest.mark.parametrize("digest", ["sha256:../../etc/passwd", "md5:abc", "sha256:" + "A" * 64, "sha256:" + "a" * 63])
def test_bad_digests_never_become_paths(tmp_path, digest):
    with pytest.raises(InvalidManifest, match="invalid layer digest"):
        blob_path(tmp_path, digest)


def test_manifest_with_bad_digest_is_refused(store_copy):
    path = manifest_of(store_copy, "tiny-draft")
    doc = json.loads(path.read_text())
    doc["layers"][0]["digest"] = "sha256:../../../escape"
    path.write_text(json.dumps(doc))
    with pytest.raises(InvalidManifest, match="invalid layer digest 'sha256:../../../escape'"):
        Store(find_store_root(store_copy)).resolve("tiny-draft")


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


def test_invalid_manifest_json(store_copy):
    manifest_of(store_copy, "tiny-draft").write_text("{not json")
    with pytest.raises(InvalidManifest, match="is not valid JSON"):
        Store(find_store_root(store_copy)).resolve("tiny-draft")


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
        ["bench", "tiny-target", "-d", "tiny-draft", "--threads", "1", "-n", "8", "--runs", "1", "-k", "2",
         "--no-warmup", "--prompts", prompts, "--out", tmp_path / "results"],
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
    for name in ("someone/tiny", "someone/tiny:latest", "registry.ollama.ai/someone/tiny",
                 "hf.co/someone/Tiny-GGUF:Q4_K_M", "HF.CO/someone/tiny-gguf:q4_k_m",
                 "https://hf.co/someone/Tiny-GGUF:Q4_K_M",
                 "localhost:11434/team/tiny:v1", "http://localhost:11434/team/tiny:v1"):
        assert store.resolve(name).gguf_path == draft_blob, name
    for name in ("hf.co/someone/Tiny-GGUF", "localhost:11434/team/tiny", "tiny", "someone/tiny:v1", "other/tiny"):
        with pytest.raises(ModelNotFound):
            store.resolve(name)
    listed = invoke("list", "--models-dir", store_copy)
    names = {line.split()[0] for line in listed.stdout.splitlines()[1:]}
    assert {"someone/tiny:latest", "hf.co/someone/Tiny-GGUF:Q4_K_M", "localhost:11434/team/tiny:v1"} <= names
    result = invoke("generate", "hf.co/someone/Tiny-GGUF:Q4_K_M", "hi", "--no-check", "--threads", "1", "-n", "2",
                    "--json", "--models-dir", store_copy)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["target"] == "hf.co/someone/Tiny-GGUF:Q4_K_M"


def test_legacy_colon_blob_names_are_found(store_copy):
    model = Store(find_store_root(store_copy)).resolve("tiny-draft")
    dashed = blob_path(store_copy, model.layers[0].digest)
    colon = dashed.with_name(dashed.name.replace("sha256-", "sha256:"))
    dashed.rename(colon)
    assert model.gguf_path == colon


def test_parent_of_the_store_gets_a_hint(tiny_store, tmp_path):
    shutil.copytree(tiny_store, tmp_path / "dot-ollama" / "models")
    with pytest.raises(StoreNotFound, match=r"is the folder above the model store; use .*dot-ollama/models"):
        find_store_root(tmp_path / "dot-ollama")


def test_unreadable_store_says_group_ollama_even_as_root(tmp_path, monkeypatch):
    import ollama_spec.store as store_module

    root = tmp_path / "service"
    root.mkdir()

    def denied(path):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(store_module.os, "listdir", denied)
    with pytest.raises(StoreUnreadable) as err:
        find_store_root(root)
    assert str(err.value) == (
        f"the model store {root} (from --models-dir) exists but is not readable by you; "
        "add yourself to group ollama (sudo usermod -aG ollama $USER, then log in again)"
    )


def test_list_shows_a_broken_model_without_failing(store_copy, invoke):
    model = Store(find_store_root(store_copy)).resolve("tiny-draft")
    blob_path(store_copy, model.layers[0].digest).unlink()
    result = invoke("list", "--models-dir", store_copy)
    assert result.exit_code == 0
    line = next(l for l in result.stdout.splitlines() if l.startswith("tiny-draft"))
    assert "is missing" in line
