"""`ollama-spec pull <head> --head-for <target>`: EAGLE-3 head checkpoints from a Hub endpoint on 127.0.0.1 or a
folder, converted and stored like any pulled model."""

from __future__ import annotations

import hashlib
import json

import pytest

from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.models.heads import head_facts
from ollama_spec.synthetic import PAIRS
from ollama_spec.synthetic.eagle3_checkpoint import head_for, write_head_checkpoint
from ollama_spec.synthetic.layout import write_model
from tests.builders.recurrent import write_mamba_gguf
from tests.pull_servers import HubEndpoint, closed_port, snapshot

HEAD = head_for(PAIRS["tiny"], draft_vocab=200)


def checkpoint_files(tmp_path, name, layout="eagle", weights="safetensors", **config) -> dict[str, bytes]:
    folder = write_head_checkpoint(tmp_path / name, HEAD, layout, weights=weights, config=config)
    return {path.name: path.read_bytes() for path in folder.iterdir()}


@pytest.fixture
def hub(tmp_path, monkeypatch):
    server = HubEndpoint(
        {
            "user/head-eagle3": checkpoint_files(tmp_path, "a") | {"README.md": b"# head"},
            "user/head-speculators": checkpoint_files(tmp_path, "b", "speculators"),
            "user/head-bin": checkpoint_files(tmp_path, "c", weights="bin"),
            "user/not-a-head": checkpoint_files(tmp_path, "d", num_hidden_layers=32),
        }
    )
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("OLLAMA_HOST", f"http://127.0.0.1:{closed_port()}")
    yield server
    server.close()


def stored_head(store, *parts):
    manifest = json.loads((store / "manifests" / "/".join(parts)).read_text())
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.ollama.image.model"
    blob = store / "blobs" / layer["digest"].replace(":", "-")
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == layer["digest"].removeprefix("sha256:")
    return read_model_info(blob)


@pytest.mark.parametrize("repo", ["head-eagle3", "head-speculators", "head-bin"])
def test_pull_converts_a_published_head_into_the_store(invoke, hub, store_copy, repo):
    result = invoke("pull", f"hf.co/user/{repo}", "--head-for", "tiny-target", "--models-dir", store_copy)
    assert result.exit_code == 0, result.output
    assert "converting to GGUF" in result.output and "stored as an EAGLE-3 head for tiny-target:latest" in result.output
    info = stored_head(store_copy, "hf.co", "user", repo, "latest")
    assert head_facts(info).target_layers == (2, 2, 1) and head_facts(info).draft_vocab_size == 200
    assert not list((store_copy / ".ollama-spec-partial").iterdir())  # the checkpoint is not kept once stored
    assert [path for method, path, _ in hub.requests if method == "GET" and "/resolve/" in path] == [
        f"/user/{repo}/resolve/{HubEndpoint.COMMIT}/{name}"
        for name in ("config.json", "pytorch_model.bin" if repo == "head-bin" else "model.safetensors")
    ]

    paired = invoke("pair", "tiny-target", f"hf.co/user/{repo}", "--models-dir", store_copy)
    assert paired.exit_code == 0, paired.output
    assert "is an EAGLE-3 head made for tiny-target:latest's shape: it reads target layers [2, 2, 1]" in paired.output
    listed = json.loads(invoke("drafts", "tiny-target", "--json", "--models-dir", store_copy).output)
    (auto,) = [d for d in listed["drafts"] if d["auto"]]
    assert auto["model"] == f"hf.co/user/{repo}:latest" and auto["eagle3_head"]  # preferred over tiny-draft


def test_an_interrupted_download_resumes(invoke, hub, store_copy):
    data = hub.repos["user/head-eagle3"]["model.safetensors"]
    partial = store_copy / ".ollama-spec-partial"
    partial.mkdir(exist_ok=True)
    (partial / f"sha256-{hashlib.sha256(data).hexdigest()}.partial").write_bytes(data[:5000])
    result = invoke("pull", "hf.co/user/head-eagle3", "--head-for", "tiny-target", "--models-dir", store_copy)
    assert result.exit_code == 0, result.output
    assert hub.blob_gets("model.safetensors") == ["bytes=5000-"]
    assert head_facts(stored_head(store_copy, "hf.co", "user", "head-eagle3", "latest")) is not None


def test_pull_converts_a_folder_under_the_name_given(invoke, store_copy, tmp_path):
    folder = write_head_checkpoint(tmp_path / "My Head", HEAD, "speculators")
    result = invoke("pull", folder, "--head-for", "tiny-target", "--name", "tiny-eagle3:v1", "--models-dir", store_copy)
    assert result.exit_code == 0, result.output
    assert "pulled tiny-eagle3:v1 (via conversion)" in result.output
    assert head_facts(stored_head(store_copy, "registry.ollama.ai", "library", "tiny-eagle3", "v1")) is not None
    unnamed = invoke("pull", folder, "--head-for", "tiny-target", "--models-dir", store_copy)
    assert unnamed.exit_code == 0, unnamed.output
    assert head_facts(stored_head(store_copy, "registry.ollama.ai", "library", "my-head", "latest")) is not None


def one_error_line(result) -> str:
    assert result.exit_code == 1, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def test_a_checkpoint_that_is_not_a_head_is_refused_and_nothing_stored(invoke, hub, store_copy):
    before = snapshot(store_copy / "manifests")
    line = one_error_line(
        invoke("pull", "hf.co/user/not-a-head", "--head-for", "tiny-target", "--models-dir", store_copy)
    )
    assert "hf.co/user/not-a-head is not an EAGLE-3 head: its config.json (LlamaForCausalLMEagle3) has 32" in line
    assert snapshot(store_copy / "manifests") == before


def test_a_head_for_another_target_is_refused(invoke, hub, store_copy):
    line = one_error_line(
        invoke("pull", "hf.co/user/head-eagle3", "--head-for", "tiny-alien", "--models-dir", store_copy)
    )
    assert "reads target layers [2, 0, -2] but tiny-alien:latest has 1 layers: it is no head for this target" in line
    assert not (store_copy / "manifests" / "hf.co").exists()


def test_a_head_for_a_recurrent_target_is_refused_before_any_download(invoke, hub, store_copy, tmp_path):
    write_model(store_copy, "tiny-mamba", write_mamba_gguf(tmp_path / "mamba.gguf"))
    line = one_error_line(
        invoke("pull", "hf.co/user/head-eagle3", "--head-for", "tiny-mamba", "--models-dir", store_copy)
    )
    assert "a recurrent or hybrid model (mamba) cannot drop rejected drafts" in line
    assert hub.requests == []


def test_a_head_named_as_a_draft_for_another_target_is_refused(invoke, hub, store_copy):
    assert (
        invoke("pull", "hf.co/user/head-eagle3", "--head-for", "tiny-target", "--models-dir", store_copy).exit_code == 0
    )
    line = one_error_line(invoke("pair", "tiny-draft", "hf.co/user/head-eagle3", "--models-dir", store_copy))
    assert "the head reads target layers [2, 2, 1] but the target has 1 layers" in line
    line = one_error_line(
        invoke("check", "tiny-draft", "--draft", "hf.co/user/head-eagle3", "--models-dir", store_copy)
    )
    assert "cannot draft for tiny-draft:latest" in line


def test_head_for_takes_one_model(invoke, store_copy):
    result = invoke("pull", "a", "b", "--head-for", "tiny-target", "--models-dir", store_copy)
    assert result.exit_code == 2 and "--head-for converts one head at a time" in result.output


def test_a_preset_and_serve_name_a_stored_head(invoke, hub, store_copy, tmp_path):
    from ollama_spec.server.serving.pairs import StorePairs

    assert (
        invoke("pull", "hf.co/user/head-eagle3", "--head-for", "tiny-target", "--models-dir", store_copy).exit_code == 0
    )
    preset = tmp_path / "head.Modelfile"
    preset.write_text("FROM tiny-target\nDRAFT hf.co/user/head-eagle3\n")
    checked = invoke("check", "-f", preset, "--models-dir", store_copy)
    assert checked.exit_code == 0, checked.output
    assert "note: hf.co/user/head-eagle3:latest is an EAGLE-3 head: it reads target layers [2, 2, 1]" in checked.output
    preset.write_text("FROM tiny-draft\nDRAFT hf.co/user/head-eagle3\n")
    assert "cannot draft for tiny-draft:latest" in one_error_line(
        invoke("check", "-f", preset, "--models-dir", store_copy)
    )

    store = StorePairs(models_dir=str(store_copy))
    assert store.describe("tiny-target")[1:] == (
        "hf.co/user/head-eagle3:latest",
        (
            "the store's EAGLE-3 head made for it: hf.co/user/head-eagle3:latest (EAGLE-3 head: reads target layers "
            "[2, 2, 1], 64 wide; 200-token draft vocabulary (d2t); converted for tiny-target)"
        ),
    )
    paired = StorePairs(models_dir=str(store_copy), pairs={"tiny-target": "hf.co/user/head-eagle3"})
    assert paired.describe("tiny-target")[1] == "hf.co/user/head-eagle3:latest"
    assert store.describe("tiny-draft")[1] == "tiny-draft:q4_0"  # the head reads layers tiny-draft lacks


def test_pair_refuses_a_head_with_two_target_layers(invoke, store_copy, tmp_path):
    from tests.builders.heads import converted_head, rewritten

    head = converted_head(store_copy, tmp_path / "head.gguf")
    two = rewritten(head, tmp_path / "two.gguf", eagle3__target_layers=[1, 2])
    line = one_error_line(invoke("pair", "tiny-target", two, "--models-dir", store_copy))
    assert line == (
        "Error: two.gguf cannot draft for tiny-target:latest: the head reads 2 target layers [1, 2]; "
        "an EAGLE-3 head reads exactly 3"
    )


def test_a_source_that_is_no_checkpoint_gets_one_line(invoke, store_copy, tmp_path):
    def pulled(source):
        return one_error_line(invoke("pull", source, "--head-for", "tiny-target", "--models-dir", store_copy))

    assert pulled(tmp_path / "nothing") == f"Error: --head-for: {tmp_path / 'nothing'} is no folder (a head " + (
        "checkpoint is a folder with config.json)"
    )
    assert pulled(tmp_path) == f"Error: {tmp_path} has no config.json: it is no head checkpoint"
    assert "'llama3.1:8b' is neither" in pulled("llama3.1:8b")
    assert "model 'llama3.1:8b' not found" in one_error_line(
        invoke("pull", tmp_path, "--head-for", "llama3.1:8b", "--models-dir", store_copy)
    )


def test_weights_the_store_has_as_a_blob_are_read_there_and_kept(invoke, hub, store_copy):
    from ollama_spec.synthetic.layout import add_blob

    digest, _ = add_blob(store_copy, hub.repos["user/head-eagle3"]["model.safetensors"])
    result = invoke("pull", "hf.co/user/head-eagle3", "--head-for", "tiny-target", "--models-dir", store_copy)
    assert result.exit_code == 0, result.output
    assert hub.blob_gets("model.safetensors") == []
    assert (store_copy / "blobs" / digest.replace(":", "-")).is_file()


def test_auto_prefers_only_a_head_converted_for_the_target(invoke, store_copy, tmp_path):
    from ollama_spec.synthetic.layout import write_model
    from tests.builders.heads import converted_head, rewritten

    head = converted_head(store_copy, tmp_path / "head.gguf")
    write_model(store_copy, "other-head", rewritten(head, tmp_path / "other.gguf", general__base_model__0__name="x"))
    listed = json.loads(invoke("drafts", "tiny-target", "--json", "--models-dir", store_copy).output)
    (auto,) = [d for d in listed["drafts"] if d["auto"]]
    assert auto["model"] == "tiny-draft:q4_0"  # the head fits the shape, but was converted for model "x"
    (other,) = [d for d in listed["drafts"] if d["model"] == "other-head:latest"]
    assert other["eagle3_head"] and other["note"].endswith("; converted for x")
    write_model(store_copy, "own-head", head)
    listed = json.loads(invoke("drafts", "tiny-target", "--json", "--models-dir", store_copy).output)
    assert [d["model"] for d in listed["drafts"] if d["auto"]] == ["own-head:latest"]


def test_pulled_heads_draft_with_draft_name(invoke, store_copy, tmp_path):
    """Heads written by the run-time side's builder, published as checkpoints and pulled, draft with --draft NAME
    as EAGLE-3 heads: one that borrows the target's embeddings and output (which only a head's context can), and
    the crafted one (it knows the target's bigrams). Greedy text is the target's own."""
    from ollama_spec.models.resolve import resolve_model
    from ollama_spec.synthetic.eagle3_checkpoint import checkpoint_from_gguf
    from tests.builders.eagle3_heads import build_heads

    heads = build_heads(resolve_model("tiny-target", str(store_copy)).path, tmp_path)

    def generate(*draft):
        args = ["generate", "tiny-target", "The quick brown fox", "-n", "24", "-t", "0", "--raw", "--json"]
        result = invoke(*args, "--threads", "1", "--no-check", "--models-dir", store_copy, *draft)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    alone = generate()["text"]
    for kind, layout in (("borrowing", "eagle"), ("crafted", "speculators")):
        folder = checkpoint_from_gguf(heads[kind], tmp_path / f"{kind}-ckpt", layout)
        pulled = invoke("pull", folder, "--head-for", "tiny-target", "--name", kind, "--models-dir", store_copy)
        assert pulled.exit_code == 0, pulled.output
        drafted = generate("--draft", kind, "-k", "4")
        assert drafted["text"] == alone and drafted["draft"] == f"{kind}:latest" and drafted["drafted"] > 0
        if kind == "crafted":
            assert drafted["accepted"] > 0, drafted
