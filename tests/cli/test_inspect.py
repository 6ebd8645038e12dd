import json
import logging

import pytest

from ollama_spec import __version__
from ollama_spec.models.resolve import resolve_model
from ollama_spec.synthetic.layout import add_blob


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
    assert [m["name"] for m in data["models"]] == [
        "tiny-alien:latest",
        "tiny-draft:latest",
        "tiny-draft:q4_0",
        "tiny-draft:q8_0",
        "tiny-target:latest",
        "tiny-target:q4_0",
        "tiny-target:q8_0",
    ]
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
        (
            "Error: tiny-alien:latest cannot draft for tiny-target:latest: BOS differs: add_bos True / id 507 in target, "
            "add_bos True / id 1019 in draft; vocab sizes 512 vs 1024 differ by more than 128"
        )
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
        ): f"Error: model 'nothere' not found in {tiny_store} (from --models-dir); pull it with 'ollama-spec pull nothere'",
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
    assert (
        "tiny-target, tiny-draft, tiny-target:q8_0, tiny-draft:q8_0, tiny-target:q4_0, tiny-draft:q4_0, tiny-alien"
    ) in result.stdout
    assert not [p for p in (tmp_path / "demo" / "blobs").iterdir() if not p.name.startswith("sha256-")]
    assert not [p for p in (tmp_path / "demo").iterdir() if p.name.startswith(".staging")]


def test_demo_store_says_what_it_writes_and_nothing_of_the_gguf_writers(invoke, tmp_path, caplog):
    caplog.set_level(logging.INFO)  # as a log configured at INFO (serve's) would show them
    result = invoke("demo-store", tmp_path / "demo", "--tiny-only")
    assert result.exit_code == 0
    for line in ("This GGUF file is for Little Endian only", "Writing the following files"):
        assert line not in result.output and line not in caplog.text
    lines = result.stderr.splitlines()
    assert lines[0] == "generating weights for tiny-target (tiny F32 pair for tests (builds in well under a second))"
    assert "writing tiny-target: 4 layers, F32" in lines


# --- the store/CLI audit ------------------------------------------------------------------------
@pytest.fixture
def store(store_copy):
    return store_copy


def test_show_escapes_control_characters_from_the_file(store, invoke):
    from tests.stores import LIBRARY, variant

    blob = resolve_model("tiny-target", str(store)).path
    data = blob.read_bytes()
    assert data.count(b"tiny-target") == 1  # general.name
    evil = b"\x1b]0;PWN\x07\nX"  # sets a terminal's title, then fakes a line of its own
    digest, size = add_blob(store, data.replace(b"tiny-target", evil.ljust(11, b"Y")))
    model = json.loads(store.joinpath(*LIBRARY, "tiny-target", "latest").read_text())["layers"][0]
    variant(store, "evil", keep=lambda layer: layer["digest"] != model["digest"], extra=[("model", (digest, size))])
    shown = invoke("show", "evil", "--models-dir", store)
    assert shown.exit_code == 0, shown.output
    assert "\x1b" not in shown.output and "\x07" not in shown.output
    assert "    name                 \\x1b]0;PWN\\x07\\nXY\n" in shown.output


def test_show_verify_checks_the_config_blob(store, invoke):
    from ollama_spec.models.store import Store, blob_path, find_store_root

    config = Store(find_store_root(store)).resolve("tiny-target").config_layer
    path = blob_path(store, config.digest)
    data = bytearray(path.read_bytes())
    data[5] ^= 1
    path.write_bytes(bytes(data))
    verified = invoke("show", "tiny-target", "--verify", "--models-dir", store)
    assert verified.exit_code == 1
    assert verified.output.strip() == (
        f"Error: blob {path} does not match its digest {config.digest} (corrupt file; pull the model again)"
    )
    path.unlink()
    shown = invoke("show", "tiny-target", "--models-dir", store)
    assert shown.exit_code == 0
    assert f"  note: Ollama cannot load it: config blob {path} is missing" in shown.output


def test_pair_says_when_a_draft_is_no_smaller_and_when_it_is_the_target(tiny_store, invoke):
    larger = invoke("pair", "tiny-draft", "tiny-target", "--models-dir", tiny_store)
    assert larger.exit_code == 0
    assert larger.stdout.splitlines()[1] == (
        "draft weights are 2.1x LARGER than the target's (speculation is slower than the target alone)"
    )
    same = invoke("pair", "tiny-target", "TINY-TARGET", "--models-dir", tiny_store)
    assert same.stderr == (
        "warning: tiny-target:latest and tiny-target:latest are the same model (one blob): a "
        "model drafting for itself only adds work\n"
    )
    assert same.stdout.splitlines()[1] == (
        "draft weights are as large as the target's (speculation is slower than the target alone)"
    )
    smaller = invoke("pair", "tiny-target", "tiny-draft", "--models-dir", tiny_store)
    assert smaller.stdout.splitlines()[1] == (
        "draft weights are 2.1x smaller than the target's (over a tenth of the target's size: drafting rarely pays)"
    )
    assert smaller.stderr == ""
