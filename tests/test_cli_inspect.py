import json

from ollama_spec import __version__


def test_version_and_help(invoke):
    assert invoke("--version").output.strip() == f"ollama-spec, version {__version__}"
    for command in ([], ["list"], ["show"], ["pair"], ["demo-store"], ["generate"], ["check"], ["bench"], ["doctor"]):
        result = invoke(*command, "-h")
        assert result.exit_code == 0 and "Examples:" in result.output


def test_list_table(invoke, tiny_store):
    result = invoke("list", "--models-dir", tiny_store)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "ARCH", "PARAMS", "QUANT"]
    rows = {line.split()[0]: line.split()[-3:] for line in lines[1:]}
    assert rows["tiny-target:latest"] == ["llama", "213.6K", "F32"]
    assert rows["tiny-target:q8_0"] == ["llama", "213.6K", "Q8_0"] and rows["tiny-draft:q4_0"][-1] == "Q4_0"
    assert f"store: {tiny_store} (from --models-dir)" in result.stderr


def test_list_json_uses_env(invoke, tiny_store, monkeypatch):
    monkeypatch.setenv("OLLAMA_MODELS", str(tiny_store))
    data = json.loads(invoke("list", "--json").stdout)
    assert data["store_source"] == "OLLAMA_MODELS"
    assert [m["name"] for m in data["models"]] == ["tiny-alien:latest", "tiny-draft:latest", "tiny-draft:q4_0",
                                                   "tiny-draft:q8_0", "tiny-target:latest", "tiny-target:q4_0",
                                                   "tiny-target:q8_0"]
    assert data["models"][4]["parameter_count"] == 213568


def test_show(invoke, tiny_store):
    result = invoke("show", "tiny-target", "--models-dir", tiny_store)
    assert result.exit_code == 0
    assert "blob          " + str(tiny_store / "blobs") in result.output
    assert "    vocab_size           512" in result.output
    data = json.loads(invoke("show", "tiny-target", "--json", "--models-dir", tiny_store).stdout)
    assert data["gguf"]["eot_token_id"] == 511
    assert [l["type"] for l in data["layers"]] == ["model", "template", "license", "params"]


def test_pair_ok_and_incompatible(invoke, tiny_store):
    ok = invoke("pair", "tiny-target", "tiny-draft", "--models-dir", tiny_store)
    # names as stored (Ollama's getExistingName), whatever spelling was typed
    assert ok.exit_code == 0 and ok.output.startswith("tiny-draft:latest can draft for tiny-target:latest")
    bad = invoke("pair", "tiny-target", "tiny-alien", "--models-dir", tiny_store)
    assert bad.exit_code == 1
    assert bad.output.strip().splitlines() == [
        "Error: tiny-alien:latest cannot draft for tiny-target:latest: BOS differs: add_bos True / id 507 in target, "
        "add_bos True / id 1019 in draft; vocab sizes 512 vs 1024 differ by more than 128"
    ]
    data = json.loads(invoke("pair", "tiny-target", "tiny-alien", "--json", "--models-dir", tiny_store).stdout)
    assert data["compatible"] is False


def test_errors_are_one_line_with_nonzero_exit(invoke, tiny_store, tmp_path):
    cases = {
        (
            "show",
            "../etc/passwd",
        ): "Error: no such file: ../etc/passwd",  # a path, never a name
        (
            "show",
            "nothere",
        ): f"Error: model 'nothere' not found in {tiny_store} (from --models-dir); pull it with 'ollama pull nothere'",
        ("pair", "tiny-target", "x:"): "Error: invalid model name 'x:': the tag is empty",
    }
    for args, message in cases.items():
        result = invoke(*args, "--models-dir", tiny_store)
        assert result.exit_code == 1, result.output
        assert result.output.strip().splitlines() == [message]
    missing = invoke("list", "--models-dir", tmp_path / "none")
    assert missing.exit_code == 1
    assert (
        missing.output.strip()
        == f"Error: the model store {tmp_path / 'none'} (from --models-dir) does not exist or is not a directory"
    )


def test_pair_takes_gguf_paths(invoke, tiny_models, tmp_path):
    target, draft = tiny_models
    (tmp_path / "target.gguf").symlink_to(target.path)
    (tmp_path / "draft.gguf").symlink_to(draft.path)
    result = invoke("pair", tmp_path / "target.gguf", tmp_path / "draft.gguf")
    assert result.exit_code == 0, result.output
    assert "target.gguf" in result.output


def test_demo_store_builds_tiny_pair(invoke, tmp_path):
    result = invoke("demo-store", tmp_path / "demo", "--tiny-only")
    assert result.exit_code == 0
    assert ("tiny-target, tiny-draft, tiny-target:q8_0, tiny-draft:q8_0, tiny-target:q4_0, tiny-draft:q4_0, "
            "tiny-alien") in result.stdout
    assert not [p for p in (tmp_path / "demo" / "blobs").iterdir() if not p.name.startswith("sha256-")]
    assert not [p for p in (tmp_path / "demo").iterdir() if p.name.startswith(".staging")]
