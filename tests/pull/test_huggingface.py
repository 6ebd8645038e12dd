"""`ollama-spec pull hf.co/<user>/<repo>:<quant>` against a Hugging Face-compatible endpoint on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from ollama_spec.errors import ModelNotFound, PullError
from ollama_spec.pull.huggingface import RepoFile, quant_of, select_gguf, select_projector
from tests.pull_servers import HubEndpoint, closed_port, snapshot

TEMPLATE = "{{ .Prompt }}"
PARAMS = {"stop": ["<|eot_id|>"], "temperature": 0.2}


def model_blob(tiny_store, model: str) -> bytes:
    doc = json.loads((tiny_store / "manifests/registry.ollama.ai/library" / model / "latest").read_text())
    digest = next(layer["digest"] for layer in doc["layers"] if layer["mediaType"].endswith("model"))
    return (tiny_store / "blobs" / digest.replace(":", "-")).read_bytes()


@pytest.fixture
def hub(tiny_store, monkeypatch):
    target, draft = model_blob(tiny_store, "tiny-target"), model_blob(tiny_store, "tiny-draft")
    server = HubEndpoint(
        {
            "user/tiny-GGUF": {
                "README.md": b"# tiny",
                "tiny-Q4_K_M.gguf": target,
                "tiny-Q8_0.gguf": draft,
                "tiny-Q5_K_M-00001-of-00002.gguf": target[:5000],
                "tiny-Q5_K_M-00002-of-00002.gguf": target[5000:],
                "template": TEMPLATE.encode(),
                "params": json.dumps(PARAMS).encode(),
            },
            "user/bare-GGUF": {"model.f16.gguf": draft},
            "user/broken-GGUF": {"b-Q4_K_M.gguf": b"not a GGUF at all " * 100},
            "user/vision-GGUF": {"v-Q8_0.gguf": target, "mmproj-v-f32.gguf": draft + b"32", "mmproj-v-f16.gguf": draft},
        }
    )
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("OLLAMA_HOST", f"http://127.0.0.1:{closed_port()}")
    yield server
    server.close()


@pytest.fixture
def store(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    return root


def test_pull_quant_case_insensitively_with_template_and_params(invoke, hub, store, tiny_store):
    result = invoke("pull", "hf.co/user/tiny-GGUF:q8_0", "--models-dir", store)
    assert result.exit_code == 0, result.output
    assert "via hf" in result.output
    manifest = json.loads((store / "manifests/hf.co/user/tiny-GGUF/q8_0").read_text())
    kinds = [layer["mediaType"].rsplit(".", 1)[-1] for layer in manifest["layers"]]
    assert kinds == ["model", "template", "params"]
    blob = store / "blobs" / manifest["layers"][0]["digest"].replace(":", "-")
    assert blob.read_bytes() == model_blob(tiny_store, "tiny-draft")
    config = json.loads((store / "blobs" / manifest["config"]["digest"].replace(":", "-")).read_text())
    assert config["model_format"] == "gguf" and config["model_family"] == "llama" and config["file_type"] == "Q8_0"
    assert [m for m, path, _ in hub.requests if "/resolve/" in path] == ["GET"] * 3  # gguf, template, params

    shown = invoke("show", "hf.co/user/tiny-GGUF:q8_0", "--verify", "--models-dir", store, "--json")
    assert shown.exit_code == 0, shown.output
    generated = invoke(
        "generate",
        "hf.co/user/tiny-GGUF:Q8_0",
        "Hi",
        "-n",
        "4",
        "--threads",
        "1",
        "--no-check",
        "-t",
        "0",
        "--models-dir",
        store,
        "--json",
    )
    assert generated.exit_code == 0, generated.output
    assert json.loads(generated.output)["generated_tokens"] == 4


def test_default_tag_is_q4_k_m_and_huggingface_co_works(invoke, hub, store, tiny_store):
    for name in ("hf.co/user/tiny-GGUF", "huggingface.co/user/tiny-GGUF:Q4_K_M"):
        result = invoke("pull", name, "--models-dir", store)
        assert result.exit_code == 0, result.output
    for path in ("hf.co/user/tiny-GGUF/latest", "huggingface.co/user/tiny-GGUF/Q4_K_M"):
        manifest = json.loads((store / "manifests" / path).read_text())
        blob = store / "blobs" / manifest["layers"][0]["digest"].replace(":", "-")
        assert blob.read_bytes() == model_blob(tiny_store, "tiny-target")


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("hf.co/user/tiny-GGUF:Q3_K_S", "has no Q3_K_S GGUF; it has: Q4_K_M, Q5_K_M, Q8_0"),
        ("hf.co/user/tiny-GGUF:Q5_K_M", "is split into 2 files (tiny-Q5_K_M-00001-of-00002.gguf)"),
        ("hf.co/user/missing-GGUF", "hf.co/user/missing-GGUF not found on http://127.0.0.1:"),
    ],
)
def test_hf_errors_leave_the_store_as_it_was(invoke, hub, store, name, message):
    before = snapshot(store)
    result = invoke("pull", name, "--models-dir", store)
    assert result.exit_code == 1
    assert message in result.output and result.output.splitlines()[-1].startswith("Error: ")
    assert snapshot(store) == before


def test_unreachable_hub(invoke, hub, store, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    result = invoke("pull", "hf.co/user/tiny-GGUF", "--models-dir", store)
    assert result.exit_code == 1 and "cannot reach Hugging Face at http://127.0.0.1:" in result.output


def test_single_gguf_repo_without_q4_k_m_pulls_its_only_file(invoke, hub, store):
    result = invoke("pull", "hf.co/user/bare-GGUF", "--models-dir", store)
    assert result.exit_code == 0, result.output
    manifest = json.loads((store / "manifests/hf.co/user/bare-GGUF/latest").read_text())
    assert [layer["mediaType"].rsplit(".", 1)[-1] for layer in manifest["layers"]] == ["model"]


def test_via_hf_needs_a_hugging_face_name(invoke, hub, store):
    result = invoke("pull", "llama3.2:1b", "--via", "hf", "--models-dir", store)
    assert result.exit_code == 1 and "--via hf needs a Hugging Face name" in result.output


def test_quant_names():
    assert quant_of("Llama-3.2-1B-Instruct-Q4_K_M.gguf") == "Q4_K_M"
    assert quant_of("sub/model.iq4_xs.gguf") == "IQ4_XS"
    assert quant_of("big-Q6_K-00001-of-00003.gguf") == "Q6_K"
    assert quant_of("model-bf16.gguf") == "BF16"
    assert quant_of("model.gguf") is None
    files = [RepoFile("m-Q4_K.gguf", 10, "a" * 64), RepoFile("m-Q4_K_M.gguf", 10, "b" * 64)]
    assert select_gguf("u/r", files, "q4_k").name == "m-Q4_K.gguf"  # Q4_K is not a prefix match of Q4_K_M
    assert select_gguf("u/r", files, "latest").name == "m-Q4_K_M.gguf"
    with pytest.raises(ModelNotFound, match="has no GGUF files"):
        select_gguf("u/r", [RepoFile("README.md", 1, None)], "latest")
    with pytest.raises(PullError, match="no sha256"):
        select_gguf("u/r", [RepoFile("m-Q4_K_M.gguf", 10, None)], "latest")


def test_selection_as_hugging_faces_ollama_integration_reads_tags():
    def files(*names):
        return [RepoFile(n, 10, f"{i:064x}") for i, n in enumerate(names)]

    two = files("m-Q8_0.gguf", "m-Q4_1.gguf", "m-Q2_K.gguf", "mmproj-m-f16.gguf")
    assert select_gguf("u/r", two, "latest").name == "m-Q4_1.gguf"  # no Q4_K_M: a reasonable quant, not an error
    assert select_gguf("u/r", two, "M-Q8_0.GGUF").name == "m-Q8_0.gguf"  # a file's full name as the tag
    variants = files("m-Q4_1-imat.gguf", "m-Q4_1.gguf")
    assert select_gguf("u/r", variants, "Q4_1").name == "m-Q4_1.gguf"  # the plain file over a variant
    assert select_projector(two).name == "mmproj-m-f16.gguf"
    assert select_projector(files("m-Q4_1.gguf")) is None


def test_a_vision_repo_brings_its_projector(invoke, hub, store):
    result = invoke("pull", "hf.co/user/vision-GGUF:Q8_0", "--models-dir", store)
    assert result.exit_code == 0, result.output
    manifest = json.loads((store / "manifests/hf.co/user/vision-GGUF/Q8_0").read_text())
    kinds = [layer["mediaType"].rsplit(".", 1)[-1] for layer in manifest["layers"]]
    assert kinds == ["model", "projector"]
    projector = store / "blobs" / manifest["layers"][1]["digest"].replace(":", "-")
    assert projector.stat().st_size == manifest["layers"][1]["size"]
    assert "no Ollama template layer" in result.output  # ollama-spec reads the GGUF's; Ollama would not


def test_a_file_that_is_no_gguf_is_named_and_gets_no_manifest(invoke, hub, store):
    result = invoke("pull", "hf.co/user/broken-GGUF", "--models-dir", store)
    assert result.exit_code == 1
    last = result.output.splitlines()[-1]
    assert last.startswith("Error: hf.co/user/broken-GGUF: b-Q4_K_M.gguf is not a readable GGUF (")
    assert last.endswith("no manifest was written")
    assert not any(p.is_file() for p in (store / "manifests").rglob("*"))
