"""Names and paths -> ResolvedModel: the layers Ollama reads that change what a model is or says."""

import json

import pytest

from ollama_spec.errors import InvalidManifest, ModelNotFound, NotGGUF, UnusableModel
from ollama_spec.models.resolve import (
    gguf_file,
    looks_like_path,
    resolve_model,
    stored_draft_model,
    template_warning,
)
from ollama_spec.prompting.messages import ChatMessage
from ollama_spec.synthetic.catalog import PAIRS
from tests.stores import lora_variant, variant


@pytest.fixture
def store(store_copy):
    return store_copy


def test_an_adapter_layer_is_resolved_to_apply_and_counted_in_the_plan(store, invoke, tmp_path):
    lora_variant(store, "lora", tmp_path)
    model = resolve_model("lora", str(store))
    assert len(model.adapters) == 1 and model.adapters[0].metadata["adapter.type"] == "lora"
    assert model.loaded_info.tensor_bytes == model.info.tensor_bytes + model.adapters[0].tensor_bytes > 0
    plans = [
        json.loads(invoke("check", name, "--json", "--models-dir", store).stdout) for name in ("tiny-target", "lora")
    ]
    base, lora = (plan["target"]["file_weights"] for plan in plans)
    assert lora == base + model.adapters[0].tensor_bytes  # llama.cpp loads the adapter beside the weights
    shown = invoke("show", "lora", "--models-dir", store)
    assert shown.exit_code == 0 and "note: a LoRA adapter layer: applied over the weights, as Ollama" in shown.output


def test_an_adapter_layer_that_is_no_lora_is_refused_for_target_and_draft(store, invoke):
    variant(store, "lora", extra=[("adapter", "tiny-draft")])
    message = (
        "lora:latest's adapter layer is not a GGUF LoRA adapter, the only kind llama.cpp applies (convert it "
        "with llama.cpp's convert_lora_to_gguf.py)"
    )
    with pytest.raises(UnusableModel) as err:
        resolve_model("lora", str(store))
    assert str(err.value) == message
    for args in (
        ("generate", "lora", "hi"),
        ("generate", "tiny-target", "hi", "-d", "lora"),
        ("pair", "lora", "tiny-draft"),
        ("check", "tiny-target", "-d", "lora"),
        ("drafts", "lora"),
    ):
        result = invoke(*args, "--models-dir", store)
        assert result.exit_code == 1 and result.output.strip().splitlines()[-1] == f"Error: {message}", args


def test_an_adapter_for_another_base_model_is_refused_from_the_headers(store, tmp_path, invoke):
    from ollama_spec.synthetic.models import Architecture

    wider = Architecture(n_embd=96, n_layer=2, n_head=4, n_kv_head=2, n_ff=160)
    lora_variant(store, "wide-lora", tmp_path, arch=wider, n_layer=2)
    message = (
        "wide-lora:latest's adapter layer does not fit the model: its 'blk.0.attn_q.weight' change is 96x96, "
        "the model's matrix 64x64 (a LoRA made for another base model?)"
    )
    for args in (("check", "wide-lora"), ("generate", "wide-lora", "hi")):  # before anything loads
        result = invoke(*args, "--models-dir", store)
        assert result.exit_code == 1 and result.output.strip().splitlines()[-1] == f"Error: {message}", args
    shown = invoke("show", "wide-lora", "--models-dir", store)
    assert (
        shown.exit_code == 0
        and "note: a LoRA adapter layer that cannot be applied (the adapter does not fit" in shown.output
    )
    lora_variant(store, "deep-lora", tmp_path, n_layer=PAIRS["tiny"].arch.n_layer + 1)  # one block more than the model
    with pytest.raises(UnusableModel, match=r"it changes 'blk.4.attn_q.weight', which the model does not have"):
        resolve_model("deep-lora", str(store))


def test_an_adapter_for_another_architecture_is_refused(store, tmp_path):
    lora_variant(store, "qwen-lora", tmp_path, architecture="qwen2")
    with pytest.raises(
        UnusableModel,
        match=r"^qwen-lora:latest's adapter layer is a LoRA adapter for 'qwen2' models, "
        r"but the model is 'llama'$",
    ):
        resolve_model("qwen-lora", str(store))


def test_a_projector_layer_is_allowed_and_noted(store, invoke):
    variant(store, "vision", extra=[("projector", "tiny-draft")])
    assert resolve_model("vision", str(store)).name == "vision:latest"
    shown = invoke("show", "vision", "--models-dir", store)
    assert "note: a vision projector layer: images are not read" in shown.output


def test_a_lora_model_is_never_an_auto_draft(store, invoke):
    variant(store, "lora-draft", base="tiny-draft", extra=[("adapter", "tiny-draft")])
    result = invoke("drafts", "tiny-target", "--json", "--models-dir", store)
    assert "lora-draft:latest" not in [row["model"] for row in json.loads(result.stdout)["drafts"]]


def test_the_messages_layer_is_read(store):
    history = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "arr"}]
    variant(store, "pirate", extra=[("messages", json.dumps(history).encode())])
    assert resolve_model("pirate", str(store)).messages == (ChatMessage("user", "hi"), ChatMessage("assistant", "arr"))
    variant(store, "garbled", extra=[("messages", b'{"role": "user"}')])
    with pytest.raises(InvalidManifest, match="^garbled:latest: its messages layer is not a list of role/content"):
        resolve_model("garbled", str(store))


def test_a_go_template_without_a_gguf_chat_template_is_warned_about(store):
    import dataclasses

    model = resolve_model("tiny-target", str(store))
    assert model.go_template and template_warning(model, "use --raw") is None  # the GGUF has its own template
    bare = dataclasses.replace(model, info=dataclasses.replace(model.info, chat_template=None))
    assert template_warning(bare, "use --raw") == (
        "tiny-target:latest has no chat template in its GGUF, only an Ollama template layer (Go templates are not "
        "supported): the conversation is sent unformatted; use --raw"
    )
    variant(
        store,
        "legacy",
        keep=lambda layer: not layer["mediaType"].endswith(".template"),
        extra=[("prompt", b"{{ .Prompt }}")],
    )
    assert resolve_model("legacy", str(store)).go_template  # Ollama's old name for the template layer
    assert template_warning(dataclasses.replace(bare, go_template=False), "use --raw") is None  # nothing to say


def test_the_draft_layer_is_the_models_own_draft(store):
    variant(store, "withdraft", extra=[("draft", "tiny-draft")])
    target = resolve_model("withdraft", str(store))
    draft = stored_draft_model(target)
    assert draft.path == resolve_model("tiny-draft", str(store)).path
    assert draft.name == "withdraft:latest (its draft layer)"
    assert resolve_model("tiny-target", str(store)).stored_draft is None


@pytest.mark.parametrize(
    "name",
    [
        "/nowhere/x.gguf",
        "./x.gguf",
        "models/llama.GGUF",
        "~/nowhere.gguf",
        "../elsewhere",
        "/nowhere/blobs/sha256-" + "a" * 64,
    ],
)
def test_a_path_that_names_no_file_says_so(name):
    assert looks_like_path(name)
    with pytest.raises(ModelNotFound) as err:
        gguf_file(name)
    assert str(err.value) == f"no such file: {name}"


def test_a_directory_named_like_a_gguf_is_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(NotGGUF, match="^dir.gguf is a directory, not a GGUF file$"):
        gguf_file("dir.gguf")


@pytest.mark.parametrize("name", ["llama3.1:70b", "hf.co/user/repo:Q4_K_M", "user/model", "sha256-" + "a" * 64])
def test_model_names_are_not_paths(name):
    assert not looks_like_path(name) and gguf_file(name) is None


def test_a_blob_path_is_a_gguf_path(store, invoke):
    blob = resolve_model("tiny-draft", str(store)).path
    assert resolve_model(str(blob)).path == blob
    shown = invoke("show", blob)
    assert shown.exit_code == 0 and shown.output.startswith(blob.name)


def test_drafts_says_auto_takes_the_stored_draft(store, invoke):
    variant(store, "withdraft", extra=[("draft", "tiny-draft")])
    result = invoke("drafts", "withdraft", "--json", "--models-dir", store)
    data = json.loads(result.stdout)
    assert data["stored_draft"] is True and not any(row["auto"] for row in data["drafts"])
    plain = invoke("drafts", "withdraft", "--models-dir", store)
    assert plain.stderr == "auto: the draft stored in withdraft:latest's manifest (also used without --draft)\n"
