"""-f presets on generate/check/bench/serve, `drafts`, --draft auto, and check's compatibility verdict."""

import json

import pytest

BASE = ("--threads", "1", "--no-check")


@pytest.fixture
def tiny_preset(tmp_path):
    path = tmp_path / "tiny.Modelfile"
    path.write_text(
        "FROM tiny-target\nDRAFT tiny-draft\nPARAMETER temperature 0\nPARAMETER num_predict 12\n"
        'PARAMETER num_speculative_tokens 3\nPARAMETER num_ctx 1024\nSYSTEM """Be brief."""\n'
    )
    return path


def test_the_shipped_demo_preset_runs_with_the_pair_overridden(invoke, tiny_store):
    result = invoke(
        "generate",
        "-f",
        "demo",
        "tiny-target",
        "Hello",
        "--draft",
        "tiny-draft",
        "--json",
        *BASE,
        "--models-dir",
        tiny_store,
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # demo.Modelfile: temperature 0, num_predict 128, K auto; the tiny pair may stop early at its end of turn.
    assert data["target"] == "tiny-target:latest" and data["draft"] == "tiny-draft:latest"
    assert 0 < data["generated_tokens"] <= 128 and data["k_chosen"]


def test_a_preset_gives_target_draft_and_parameters(invoke, tiny_store, tiny_preset):
    result = invoke("generate", "-f", tiny_preset, "Hello", "--json", *BASE, "--models-dir", tiny_store)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["target"] == "tiny-target:latest" and data["draft"] == "tiny-draft:latest"
    assert data["generated_tokens"] <= 12 and max(map(int, data["k_chosen"])) == 3  # the last steps: fewer
    same = invoke(
        "generate",
        "tiny-target",
        "Hello",
        "-d",
        "tiny-draft",
        "-t",
        "0",
        "-n",
        "12",
        "--system",
        "Be brief.",
        "-k",
        "3",
        "--json",
        *BASE,
        "--models-dir",
        tiny_store,
    )
    assert json.loads(same.stdout)["text"] == data["text"]


def test_flags_override_the_preset(invoke, tiny_store, tiny_preset):
    result = invoke(
        "generate",
        "-f",
        tiny_preset,
        "Hello",
        "-n",
        "5",
        "-k",
        "2",
        "--draft",
        "ngram",
        "--json",
        *BASE,
        "--models-dir",
        tiny_store,
    )
    data = json.loads(result.stdout)
    assert data["draft"] == "ngram" and data["generated_tokens"] <= 5


def test_a_bad_preset_is_one_line_with_file_and_line(invoke, tiny_store, tmp_path):
    path = tmp_path / "bad.Modelfile"
    path.write_text("FROM tiny-target\nPARAMETER top_k many\n")
    result = invoke("generate", "-f", path, "Hello", "--models-dir", tiny_store)
    assert result.exit_code == 1
    assert result.output == f"Error: {path}, line 2: PARAMETER top_k must be an integer, got 'many'\n"


def test_check_and_serve_accept_the_preset(invoke, tiny_store, tiny_preset, monkeypatch):
    monkeypatch.setenv("OLLAMA_SPEC_REPACK", "0")
    result = invoke("check", "-f", tiny_preset, "--json", "--models-dir", tiny_store)
    data = json.loads(result.stdout)
    assert data["target"]["model"] == "tiny-target:latest" and data["draft"]["model"] == "tiny-draft:latest"
    assert data["n_ctx"] == 1024
    assert "-f, --file MODELFILE" in invoke("serve", "-h").output
    assert "-f, --file MODELFILE" in invoke("bench", "-h").output


def test_check_refuses_an_incompatible_draft(invoke, tiny_store, monkeypatch):
    monkeypatch.setenv("OLLAMA_SPEC_REPACK", "0")
    result = invoke("check", "tiny-target", "--draft", "tiny-alien", "--models-dir", tiny_store)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("Error: tiny-alien:latest cannot draft for tiny-target:latest: ")


def test_drafts_lists_compatible_models_smallest_first(invoke, tiny_store):
    result = invoke("drafts", "tiny-target", "--json", "--models-dir", tiny_store)
    data = json.loads(result.stdout)
    names = [d["model"] for d in data["drafts"]]
    assert "tiny-alien:latest" not in names and "tiny-target:latest" not in names
    assert "tiny-draft:latest" in names
    sizes = [d["size"] for d in data["drafts"]]
    assert sizes == sorted(sizes) and all(d["ratio"] > 1 for d in data["drafts"])
    assert [d["auto"] for d in data["drafts"]].count(True) == 1
    assert all(d["note"] for d in data["drafts"])  # the tiny pair is far from the useful 1:20-1:50 range
    text = invoke("drafts", "tiny-target", "--models-dir", tiny_store).stdout
    assert "useful range about 1:20 to 1:50" in text and "over a tenth of the target's size" in text


def test_draft_auto_says_which(invoke, tiny_store):
    listed = json.loads(invoke("drafts", "tiny-target", "--json", "--models-dir", tiny_store).stdout)["drafts"]
    chosen = next(d["model"] for d in listed if d["auto"])
    result = invoke(
        "generate", "tiny-target", "Hi", "-d", "auto", "-t", "0", "-n", "4", "--json", *BASE, "--models-dir", tiny_store
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"draft: {chosen} (auto: 1:")
    assert json.loads(result.stdout)["draft"] == chosen


def test_draft_auto_without_candidates_is_one_line(invoke, tiny_store):
    result = invoke("generate", "tiny-alien", "Hi", "-d", "auto", *BASE, "--models-dir", tiny_store)
    assert result.exit_code == 1 and "--draft auto: no model in" in result.stderr and "--draft ngram" in result.stderr


def test_preset_messages_open_the_conversation(invoke, tiny_store, tiny_preset):
    plain = json.loads(
        invoke("generate", "-f", tiny_preset, "Hello", "--json", *BASE, "--models-dir", tiny_store).stdout
    )
    tiny_preset.write_text(tiny_preset.read_text() + "MESSAGE user What is 2+2?\nMESSAGE assistant Four.\n")
    opened = json.loads(
        invoke("generate", "-f", tiny_preset, "Hello", "--json", *BASE, "--models-dir", tiny_store).stdout
    )
    assert opened["prompt_tokens"] > plain["prompt_tokens"] + 8


def test_a_preset_adapter_is_applied_as_the_stores_adapter_layer(invoke, store_copy, tmp_path):
    from ollama_spec.synthetic.catalog import PAIRS
    from tests.builders.writers import write_lora_gguf
    from tests.stores import lora_variant

    lora_variant(store_copy, "tiny-lora", tmp_path, seed=3)
    write_lora_gguf(tmp_path / "same.gguf", arch=PAIRS["tiny"].arch, n_layer=PAIRS["tiny"].arch.n_layer, seed=3)
    preset = tmp_path / "lora.Modelfile"
    preset.write_text("FROM tiny-target\nADAPTER ./same.gguf\n")
    args = ("Once upon a time", "--raw", "--json", "-t", "0", "-n", "20", "--models-dir", store_copy)
    texts = [
        json.loads(invoke("generate", *model, *args).stdout)["text"]
        for model in (("-f", preset), ("tiny-lora",), ("tiny-target",))
    ]
    assert texts[0] == texts[1] != texts[2]
    preset.write_text("FROM tiny-target\nADAPTER ./missing.gguf\n")
    result = invoke("generate", "-f", preset, *args)
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.strip().splitlines()[-1].startswith(f"Error: {preset}: ADAPTER {tmp_path / 'missing.gguf'}: ")


# Every command that takes -f reads the preset through the same parser: an out-of-range value is
# refused by all of them alike, not only by those that go on to sample with it.
PRESET_COMMANDS = [("check",), ("generate", "Hello"), ("chat",), ("serve",), ("bench",), ("vllm",)]


@pytest.mark.parametrize(
    "parameter, message",
    [
        ("num_ctx 0", "PARAMETER num_ctx must be a positive integer, got '0'"),
        ("temperature nan", "PARAMETER temperature must be >= 0, got 'nan'"),
        ("top_p nan", "PARAMETER top_p must be in (0, 1], got 'nan'"),
        ("draft_p_min 5", "PARAMETER draft_p_min must be in [0, 1), got '5'"),
    ],
)
@pytest.mark.parametrize("command", PRESET_COMMANDS, ids=lambda c: c[0])
def test_every_command_refuses_an_out_of_range_preset_alike(invoke, tiny_store, tmp_path, command, parameter, message):
    path = tmp_path / "bad.Modelfile"
    path.write_text(f"FROM tiny-target\nDRAFT tiny-draft\nPARAMETER {parameter}\n")
    store = () if command[0] == "vllm" else ("--models-dir", tiny_store)  # vllm reads no store
    result = invoke(command[0], "-f", path, *command[1:], *store)
    assert result.exit_code == 1
    assert result.output == f"Error: {path}, line 3: {message}\n"


def test_serve_refuses_an_out_of_range_store_preset_as_minus_f_does(invoke, tiny_store, tmp_path, monkeypatch):
    monkeypatch.setattr("ollama_spec.server.serve", lambda *args: pytest.fail("served with a refused preset"))
    path = tmp_path / "bad.Modelfile"
    path.write_text("FROM tiny-target\nDRAFT tiny-draft\nPARAMETER temperature nan\n")
    result = invoke("serve", "--preset", path, "--models-dir", tiny_store, "--port", "0")  # the store: no TARGET
    assert result.exit_code == 1
    assert result.output == f"Error: {path}, line 3: PARAMETER temperature must be >= 0, got 'nan'\n"


EDGES = (
    "PARAMETER temperature 0\nPARAMETER top_p 1\nPARAMETER min_p 1\nPARAMETER top_k 0\n"
    "PARAMETER draft_p_min 0.99\nPARAMETER repeat_last_n -1\nPARAMETER num_ctx 1024\n"
)


@pytest.mark.parametrize("command", PRESET_COMMANDS, ids=lambda c: c[0])
def test_every_command_reads_a_preset_at_the_edges_of_the_ranges(invoke, tmp_path, command):
    path = tmp_path / "edges.Modelfile"
    path.write_text(f"FROM tiny-target\nDRAFT tiny-draft\n{EDGES}")
    result = invoke(command[0], "-f", path, "-h")  # -f is read first, then the help
    assert result.exit_code == 0 and result.output.startswith("Usage: "), result.output


def test_check_and_generate_run_with_a_preset_at_the_edges(invoke, tiny_store, tmp_path, monkeypatch):
    monkeypatch.setenv("OLLAMA_SPEC_REPACK", "0")
    path = tmp_path / "edges.Modelfile"
    path.write_text(f"FROM tiny-target\nDRAFT tiny-draft\n{EDGES}")
    checked = invoke("check", "-f", path, "--json", "--models-dir", tiny_store)
    assert checked.exit_code == 0 and json.loads(checked.stdout)["n_ctx"] == 1024
    generated = invoke("generate", "-f", path, "Hello", "-n", "4", "--json", *BASE, "--models-dir", tiny_store)
    assert generated.exit_code == 0, generated.output
    assert json.loads(generated.stdout)["draft"] == "tiny-draft:latest"


def test_a_presets_num_speculative_tokens_is_capped_as_k_is(invoke, tiny_store, tmp_path):
    from ollama_spec.decoding.loop import MAX_NUM_SPECULATIVE_TOKENS as MAX

    path = tmp_path / "long.Modelfile"
    path.write_text(
        "FROM tiny-target\nDRAFT tiny-draft\nPARAMETER temperature 0\nPARAMETER num_ctx 1024\n"
        "PARAMETER num_speculative_tokens 100000\n"
    )
    note = f"note: {{}} 100000 is capped to {MAX} draft tokens per step (one verify batch is at most {MAX + 1} tokens)"
    for given, args in (("the preset's num_speculative_tokens", ()), ("-k", ("-k", "100000"))):
        # enough tokens for a step of MAX drafts: none drafts past what max_tokens leaves to write
        result = invoke(
            "generate", "-f", path, "Hello", "-n", str(MAX + 9), "--json", *args, *BASE, "--models-dir", tiny_store
        )
        assert result.exit_code == 0, result.output
        assert note.format(given) in result.stderr.splitlines()
        assert max(map(int, json.loads(result.stdout)["k_chosen"])) == MAX
    at_most = invoke("generate", "-f", path, "Hello", "-n", "3", "-k", str(MAX), *BASE, "--models-dir", tiny_store)
    assert at_most.exit_code == 0 and "capped" not in at_most.stderr
