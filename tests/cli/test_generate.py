import json

import pytest

from ollama_spec.decoding.loop import DEFAULT_MAX_SPECULATIVE_TOKENS

BASE = ("--threads", "1", "--no-check", "-t", "0")


def gen(invoke, store, *args, **kwargs):
    return invoke("generate", *args, *BASE, "--models-dir", store, **kwargs)


def test_generate_streams_the_same_text_with_and_without_draft(invoke, tiny_store):
    # No near-tie in this answer's first 190 tokens (smallest top-two logit gap 0.04), so any CPU agrees.
    prompt = "Write a function that returns the sum"
    alone = gen(invoke, tiny_store, "tiny-target", prompt, "-n", "30")
    drafted = gen(invoke, tiny_store, "tiny-target", prompt, "-n", "30", "--draft", "tiny-draft", "-k", "3")
    assert alone.exit_code == 0 and drafted.exit_code == 0
    assert alone.stdout == drafted.stdout and len(alone.stdout.strip()) > 10


def test_prompt_from_stdin_and_json(invoke, tiny_store):
    result = gen(
        invoke,
        tiny_store,
        "tiny-target",
        "-d",
        "tiny-draft",
        "--json",
        "-n",
        "20",
        "-t",
        "0",
        "-k",
        "5",
        input="The quick brown fox",
    )
    data = json.loads(result.stdout)
    assert data["target"] == "tiny-target:latest" and data["draft"] == "tiny-draft:latest"
    assert data["generated_tokens"] == 20 and data["finish_reason"] == "length"
    assert data["drafted"] >= data["accepted"] > 0
    assert len(data["acceptance_by_position"]) == 5


def test_k_defaults_to_auto_and_reports_the_ks_it_chose(invoke, tiny_store):
    result = gen(
        invoke, tiny_store, "tiny-target", "The quick brown fox", "-d", "tiny-draft", "--json", "-n", "20", "-t", "0"
    )
    data = json.loads(result.stdout)
    assert sum(data["k_chosen"].values()) == data["steps"] - 1  # the prompt's own pass drafts nothing
    assert all(0 <= int(k) <= DEFAULT_MAX_SPECULATIVE_TOKENS for k in data["k_chosen"])
    fixed = json.loads(
        gen(
            invoke,
            tiny_store,
            "tiny-target",
            "The quick brown fox",
            "-d",
            "tiny-draft",
            "--json",
            "-n",
            "20",
            "-t",
            "0",
            "-k",
            "3",
        ).stdout
    )
    assert set(fixed["k_chosen"]) == {"3"} and fixed["text"] == data["text"]


def test_stats_and_compare_go_to_stderr(invoke, tiny_store):
    result = gen(invoke, tiny_store, "tiny-target", "Hi", "-d", "tiny-draft", "--compare", "--stats", "-n", "24")
    assert result.exit_code == 0
    assert "target alone:" in result.stderr and "speed-up" in result.stderr
    assert "outputs are token-identical" in result.stderr
    assert "tokens per target pass" in result.stderr


def test_gguf_paths_work_without_a_store(invoke, tiny_models, tmp_path):
    import shutil

    target, draft = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    shutil.copy(tiny_models[0].path, target)
    shutil.copy(tiny_models[1].path, draft)
    result = invoke("generate", target, "Hi", "-d", draft, *BASE, "-n", "5")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("nope", "hi"),
            "Error: model 'nope' not found in {store} (from --models-dir); pull it with 'ollama-spec pull nope'",
        ),
        (
            ("tiny-target", "hi", "-d", "tiny-alien"),
            (
                "Error: tiny-alien:latest cannot draft for tiny-target:latest: BOS differs: add_bos True / id 507 in target, "
                "add_bos True / id 1019 in draft; vocab sizes 512 vs 1024 differ by more than 128"
            ),
        ),
        (
            ("tiny-target", "hi", "-d", "tiny-draft", "-k", "0"),
            "Error: -k/--num-speculative-tokens must be at least 1 or 'auto', got 0",
        ),
        (("tiny-target", "hi", "--temperature", "-1"), "Error: temperature must be >= 0, got -1.0"),
        (("tiny-target", "hi", "--top-p", "0"), "Error: top-p must be in (0, 1], got 0.0"),
        (("tiny-target", "hi", "--top-p", "1.01"), "Error: top-p must be in (0, 1], got 1.01"),
        (("tiny-target", "hi", "--ctx", "0"), "Error: --ctx must be a positive number of tokens, got 0"),
        (("tiny-target", "hi", "--max-tokens", "0"), "Error: --max-tokens must be at least 1, got 0"),
        (
            ("tiny-target", "word " * 400, "--ctx", "256"),
            "Error: the prompt is 1214 tokens but the context holds 256; raise --ctx or shorten it",
        ),
    ],
)
def test_errors_are_one_line(invoke, tiny_store, args, message):
    result = invoke("generate", *args, "--threads", "1", "--no-check", "--models-dir", tiny_store)
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines()[-1] == message.format(store=tiny_store)
    assert "Traceback" not in result.output


def test_incompatible_draft_is_refused_before_loading(invoke, tiny_store, monkeypatch):
    from ollama_spec.engine import engine

    loads = []
    monkeypatch.setattr(engine.Engine, "_load", lambda *a, **k: loads.append(a))
    result = invoke("generate", "tiny-target", "hi", "-d", "tiny-alien", "--no-check", "--models-dir", tiny_store)
    assert result.exit_code == 1 and loads == []


def test_recurrent_target_is_refused_before_loading(invoke, tiny_store, tmp_path, monkeypatch):
    from ollama_spec.engine import engine
    from tests.builders.recurrent import write_mamba_gguf

    loads = []
    monkeypatch.setattr(engine.Engine, "_load", lambda *a, **k: loads.append(a))
    mamba = write_mamba_gguf(tmp_path / "mamba.gguf")
    result = invoke("generate", mamba, "hi", "-d", "tiny-draft", "--models-dir", tiny_store)
    assert result.exit_code == 1 and loads == []
    assert result.output.strip() == (
        "Error: tiny-draft:latest cannot draft for mamba.gguf: the target is a recurrent model (mamba) whose cache "
        "cannot drop rejected draft tokens; run it without a draft"
    )


@pytest.mark.parametrize("seed", ["-1", "-7"])
def test_a_negative_seed_means_random_as_in_ollama(invoke, tiny_store, seed):
    result = gen(invoke, tiny_store, "tiny-target", "hi", "-d", "tiny-draft", "-t", "1", "--seed", seed, "-n", "8")
    assert result.exit_code == 0, result.output


def test_compare_needs_a_draft(invoke, tiny_store):
    result = gen(invoke, tiny_store, "tiny-target", "hi", "--compare")
    assert result.exit_code == 2 and "--compare needs --draft" in result.output


def test_memory_check_refuses_what_cannot_fit_before_loading(invoke, tiny_store, monkeypatch):
    from ollama_spec.engine import engine
    from ollama_spec.llama import backends
    from ollama_spec.planning.devices import system_ram

    loads = []
    real_load = engine.Engine._load
    monkeypatch.setattr(engine.Engine, "_load", lambda *a, **k: loads.append(a) or real_load(*a, **k))
    monkeypatch.setattr(backends, "discover_devices", lambda: ([system_ram(0.001, free_gib=0.0001)], []))
    result = invoke("generate", "tiny-target", "hi", "-d", "tiny-draft", "--models-dir", tiny_store)
    assert result.exit_code == 1 and loads == []
    assert result.output.startswith("Error: ") and "fit" in result.output
    assert len(result.output.strip().splitlines()) == 1
    forced = invoke(
        "generate",
        "tiny-target",
        "hi",
        "-d",
        "tiny-draft",
        "--force",
        "--threads",
        "1",
        "-n",
        "3",
        "--models-dir",
        tiny_store,
    )
    assert forced.exit_code == 0 and loads


def test_compare_labels_a_near_tie_and_warns_on_a_real_difference():
    from ollama_spec.cli.generate import format_comparison
    from ollama_spec.engine.engine import Result

    base = Result(tokens=[1, 2, 3, 4], total_seconds=1.0, first_token_seconds=0.1)
    other = Result(tokens=[1, 2, 9, 9], total_seconds=0.5, first_token_seconds=0.1)
    tie = format_comparison(base, other, greedy=True, margins=[3.0, 2.0, 0.005, 1.0])
    assert tie.splitlines()[-1].startswith(
        "outputs part at token 2, where the target's two best logits are 0.0050 apart"
    )
    real = format_comparison(base, other, greedy=True, margins=[3.0, 2.0, 0.5, 1.0])
    assert real.splitlines()[-1] == "WARNING: outputs differ from token 2 on"
    rounded = format_comparison(base, other, greedy=True, margins=[3.0, 2.0, 0.5, 1.0], batch_size=3)
    assert rounded.splitlines()[-1].startswith(
        "outputs part at token 2, where the target itself picks the "
        "speculative token in a batch of 3 (logit margin 0.500)"
    )
    same = format_comparison(base, base, greedy=True)
    assert same.splitlines()[-1] == "outputs are token-identical"


def test_compare_tells_no_speed_up_from_a_run_too_short_to_time_and_notes_a_busy_machine(
    invoke, tiny_store, monkeypatch
):
    from ollama_spec.cli.generate import format_comparison
    from ollama_spec.engine.engine import Result

    one = Result(tokens=[1], total_seconds=0.1, first_token_seconds=0.1)
    base = Result(tokens=[1, 2, 3, 4], total_seconds=1.0, first_token_seconds=0.1)
    assert "no speed-up to tell (a run wrote under 2 tokens)" in format_comparison(base, one, greedy=False)
    monkeypatch.setattr("os.getloadavg", lambda: (64.0, 64.0, 64.0))
    result = gen(invoke, tiny_store, "tiny-target", "Hi", "-d", "tiny-draft", "--compare", "-n", "8")
    assert result.exit_code == 0 and "note: this machine is busy (load average 64.0" in result.stderr


def test_think_on_a_model_that_does_not_think_is_noted(invoke, tiny_store):
    result = gen(invoke, tiny_store, "tiny-target", "Hi", "--think", "-n", "3")
    assert result.exit_code == 0
    assert "note: tiny-target:latest is not a thinking model" in result.stderr


def test_a_model_llama_cpp_cannot_run_is_one_line(invoke, tmp_path):
    import gguf
    import numpy as np

    path = tmp_path / "odd.gguf"
    writer = gguf.GGUFWriter(path, arch="llama")  # all a header needs to pass our checks, no shapes
    writer.add_block_count(1)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["a", "b", "ab"])
    writer.add_token_merges(["a b"])
    writer.add_tensor("x", np.zeros((4, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    result = invoke("generate", path, "hi", "--no-check")
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"Error: llama.cpp could not load {path}: error loading model: error loading model hyperparameters: "
        "key not found in model: llama.context_length"
    )


def test_draft_ngram_needs_no_draft_model(invoke, tiny_store):
    text = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick"
    alone = gen(invoke, tiny_store, "tiny-target", text, "--raw", "-t", "0", "-n", "30", "--json")
    lookup = gen(invoke, tiny_store, "tiny-target", text, "--raw", "-t", "0", "-n", "30", "--json", "-d", "ngram")
    assert lookup.exit_code == 0, lookup.output
    alone, lookup = json.loads(alone.stdout), json.loads(lookup.stdout)
    assert lookup["draft"] == "ngram" and lookup["drafted"] > 0
    assert lookup["text"] == alone["text"]


@pytest.fixture
def loads(monkeypatch):
    """The (path, LoadSettings) of every model generate loads, in order; loading still happens."""
    from ollama_spec.engine import engine

    seen = []
    real = engine.LoadedModel
    monkeypatch.setattr(engine, "LoadedModel", lambda path, s: seen.append((path, s)) or real(path, s))
    return seen


def partial_offload_gpu(tiny_models, n_ctx):
    """The smallest fake GPU (next to 16 GiB of RAM) on which the plan splits the tiny target."""
    from ollama_spec.planning.devices import MIB, Device, system_ram
    from ollama_spec.planning.memory import PARTIAL_OFFLOAD, plan_memory

    for size in range(MIB, 64 * MIB, 64 << 10):
        devices = [Device("small GPU", "cuda", size, size), system_ram(16)]
        plan = plan_memory(tiny_models[0].info, tiny_models[1].info, n_ctx, devices=devices)
        if plan.verdict == PARTIAL_OFFLOAD and plan.gpu_layers > 0:
            return devices, plan
    raise AssertionError("no GPU size splits the tiny target")


def test_generate_applies_the_memory_plans_layer_split(invoke, tiny_store, tiny_models, loads, monkeypatch):
    from ollama_spec.llama import backends

    devices, plan = partial_offload_gpu(tiny_models, 2048)
    assert 0 < plan.gpu_layers < plan.target_layer_count
    looked = []
    monkeypatch.setattr(backends, "discover_devices", lambda: looked.append(1) or (list(devices), []))
    args = ("tiny-target", "-d", "tiny-draft", "--ctx", "2048", "--models-dir", tiny_store)
    check = invoke("check", *args, "--json")
    assert json.loads(check.stdout)["gpu_layers"] == plan.gpu_layers  # what `check` tells the user
    result = invoke("generate", *args, "hi", "--threads", "1", "-n", "4")
    assert result.exit_code == 0, result.output
    assert len(looked) == 2  # check, then generate's own check
    assert [(path, settings.n_gpu_layers) for path, settings in loads] == [
        (tiny_models[0].path, plan.gpu_layers),
        (tiny_models[1].path, -1),
    ]  # the draft stays on the GPU
    assert all(settings.n_ctx == 2048 for _, settings in loads)


def test_a_gpu_layer_flag_or_no_check_overrides_the_plan(invoke, tiny_store, tiny_models, loads, monkeypatch):
    from ollama_spec.llama import backends
    from ollama_spec.planning.devices import Device

    devices, _ = partial_offload_gpu(tiny_models, 2048)
    looked = []
    monkeypatch.setattr(backends, "discover_devices", lambda: looked.append(1) or (list(devices), []))
    args = ("tiny-target", "hi", "--ctx", "2048", "--threads", "1", "-n", "2", "--models-dir", tiny_store)
    assert invoke("generate", *args, "--n-gpu-layers", "1").exit_code == 0
    assert invoke("generate", *args, "--no-check").exit_code == 0
    assert [settings.n_gpu_layers for _, settings in loads] == [1, -1]
    assert len(looked) == 1  # --no-check does not even look at the devices
    roomy = [Device("big GPU", "cuda", 1 << 30, 1 << 30), *devices[1:]]
    monkeypatch.setattr(backends, "discover_devices", lambda: (roomy, []))
    assert invoke("generate", *args).exit_code == 0
    assert loads[-1][1].n_gpu_layers == -1  # full offload


def test_a_gpu_the_build_cannot_use_is_said_once(invoke, tiny_store, monkeypatch):
    from ollama_spec.llama import backends
    from ollama_spec.planning import devices

    monkeypatch.setattr(backends, "present_gpus", lambda: [devices.nvidia_gpu(24, "GPU 0: RTX 4090")])
    monkeypatch.setattr(backends, "_gpu_offload_supported", lambda: False)
    result = invoke(
        "generate", "tiny-target", "-d", "tiny-draft", "-n", "4", "-t", "0", "--models-dir", tiny_store, "Hi"
    )
    assert result.exit_code == 0, result.output
    assert result.stderr.count("llama-cpp-python was built without GPU support, so the NVIDIA GPU") == 1


SCHEMA = {
    "type": "object",
    "required": ["ok", "size"],
    "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["small", "large"]}},
}


def test_format_keeps_the_output_to_json(invoke, tiny_store, tmp_path):
    schema_file = tmp_path / "answer.schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    for given in (json.dumps(SCHEMA), str(schema_file)):
        result = gen(invoke, tiny_store, "tiny-target", "hello", "-d", "tiny-draft", "-t", "0", "--format", given)
        assert result.exit_code == 0, result.output
        assert set(json.loads(result.stdout)) == {"ok", "size"}
    free = gen(invoke, tiny_store, "tiny-target", "hello", "-t", "0", "-n", "20", "--format", "json")
    assert free.exit_code == 0 and free.stdout.lstrip().startswith("{")


@pytest.mark.parametrize(
    "given, message",
    [
        ("missing.json", "cannot read 'missing.json': No such file or directory"),
        ('{"type": ', "the schema is not valid JSON"),
        ("[1, 2]", "a JSON schema must be an object"),
    ],
)
def test_bad_formats_are_one_line_errors(invoke, tiny_store, given, message):
    result = gen(invoke, tiny_store, "tiny-target", "hello", "--format", given)
    assert result.exit_code == 1 and message in result.output
    assert "Traceback" not in result.output


def test_think_flags(invoke, tiny_store):
    """The tiny model does not think: the flags are accepted and change nothing (its template reads no
    enable_thinking). What --no-think tells a thinking template: tests/test_server_thinking.py."""
    plain = gen(invoke, tiny_store, "tiny-target", "hello", "-n", "8")
    for flag in ("--think", "--no-think"):
        result = gen(invoke, tiny_store, "tiny-target", "hello", "-n", "8", flag)
        assert result.exit_code == 0 and result.stdout == plain.stdout


# --- what a model's manifest says beyond its weights (the store/CLI audit) ------------------------
@pytest.fixture
def layered_store(tiny_store, tmp_path):
    import shutil

    from tests.stores import variant, without_chat_template

    root = tmp_path / "models"
    shutil.copytree(tiny_store, root)
    params = json.dumps({"draft_num_predict": 2, "temperature": 0}).encode()
    variant(
        root,
        "withdraft",
        keep=lambda layer: not layer["mediaType"].endswith(".params"),
        extra=[("draft", "tiny-draft"), ("params", params)],
    )
    without_chat_template(root, "notemplate")
    history = [{"role": "user", "content": "Ahoy"}, {"role": "assistant", "content": "Arr"}]
    variant(root, "pirate", extra=[("messages", json.dumps(history).encode())])
    for name, value in (("endless", {"num_predict": -1, "temperature": 0}), ("zero-ctx", {"num_ctx": 0})):
        variant(
            root,
            name,
            keep=lambda layer: not layer["mediaType"].endswith(".params"),
            extra=[("params", json.dumps(value).encode())],
        )
    return root


def test_the_draft_in_a_models_manifest_drafts_with_its_draft_num_predict(invoke, layered_store):
    result = gen(invoke, layered_store, "withdraft", "Hi", "--json", "-n", "12")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == ["note: drafting with the draft stored in withdraft:latest's manifest"]
    data = json.loads(result.stdout)
    assert data["draft"] == "withdraft:latest (its draft layer)" and data["drafted"] > 0
    assert set(data["k_chosen"]) == {"2"}  # draft_num_predict: -k's default
    fixed = json.loads(gen(invoke, layered_store, "withdraft", "Hi", "--json", "-n", "12", "-k", "3").stdout)
    assert set(fixed["k_chosen"]) == {"3"}
    auto = gen(invoke, layered_store, "withdraft", "Hi", "--json", "-n", "4", "-d", "auto")
    assert json.loads(auto.stdout)["draft"] == "withdraft:latest (its draft layer)"  # auto prefers it too
    other = json.loads(
        gen(invoke, layered_store, "withdraft", "Hi", "--json", "-n", "4", "-d", "tiny-draft:q8_0").stdout
    )
    assert other["draft"] == "tiny-draft:q8_0"


def test_a_go_template_alone_is_warned_about_and_raw_is_not(invoke, layered_store):
    result = gen(invoke, layered_store, "notemplate", "Hi", "--json", "-n", "2")
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == (
        "warning: notemplate:latest has no chat template in its GGUF, only an Ollama template layer (Go templates "
        "are not supported): the conversation is sent unformatted; use --raw to continue the text"
    )
    assert gen(invoke, layered_store, "notemplate", "Hi", "--json", "-n", "2", "--raw").stderr == ""
    chatted = invoke(
        "chat",
        "notemplate",
        "-n",
        "2",
        "--threads",
        "1",
        "--no-check",
        "--models-dir",
        layered_store,
        input="Hi\n/bye\n",
    )
    assert chatted.exit_code == 0 and "warning: notemplate:latest has no chat template in its GGUF" in chatted.stderr


def test_the_messages_layer_comes_before_the_prompt(invoke, layered_store):
    plain = json.loads(gen(invoke, layered_store, "tiny-target", "Hi", "--json", "-n", "1").stdout)["prompt_tokens"]
    pirate = json.loads(gen(invoke, layered_store, "pirate", "Hi", "--json", "-n", "1").stdout)["prompt_tokens"]
    raw = json.loads(gen(invoke, layered_store, "pirate", "Hi", "--json", "-n", "1", "--raw").stdout)["prompt_tokens"]
    assert pirate > plain > raw


def test_num_predict_minus_one_runs_until_the_context_is_full(invoke, layered_store):
    data = json.loads(gen(invoke, layered_store, "endless", "Hi", "--json", "--raw", "--ctx", "600").stdout)
    assert data["finish_reason"] in ("context", "stop") and data["generated_tokens"] != 512
    assert data["prompt_tokens"] + data["generated_tokens"] > 512


def test_a_bad_num_ctx_in_the_params_names_the_params(invoke, layered_store):
    result = gen(invoke, layered_store, "zero-ctx", "Hi")
    assert result.exit_code == 1
    assert result.output.strip() == (
        "Error: the model's params set num_ctx 0, not a positive number of tokens; give --ctx to override it"
    )


def test_the_speed_line_says_what_its_rate_measures():
    from ollama_spec.cli.generate import format_stats
    from ollama_spec.engine.engine import Result

    result = Result(
        tokens=[1] * 9, finish_reason="length", prompt_tokens=5, total_seconds=7.92, first_token_seconds=7.57
    )  # 8 tokens after the first in 0.35 s
    assert format_stats(result, speculative=False) == (
        "9 tokens in 7.92 s (decode 22.9 tok/s after a 7.57 s first token; prompt 5 tokens; finished: length)"
    )


def test_piped_text_goes_before_the_prompt_and_empty_input_is_refused(tiny_store, tmp_path):
    """As `ollama run`: `cat file | ollama-spec generate M "explain this"` reads the file first."""
    import os
    import subprocess
    import sys

    notes = tmp_path / "notes.txt"
    notes.write_text("The capital of France")
    command = [
        sys.executable,
        "-m",
        "ollama_spec",
        "generate",
        "tiny-target",
        "--raw",
        "--json",
        "-n",
        "1",
        *BASE,
        "--models-dir",
        str(tiny_store),
    ]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}

    def prompt_tokens(*args, stdin):
        with open(stdin) as source:
            run = subprocess.run([*command, *args], stdin=source, capture_output=True, text=True, env=env, timeout=120)
        return run

    alone = json.loads(prompt_tokens("is", stdin=os.devnull).stdout)["prompt_tokens"]
    piped = json.loads(prompt_tokens("is", stdin=notes).stdout)["prompt_tokens"]
    assert piped > alone
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    refused = prompt_tokens(stdin=empty)
    assert refused.returncode == 2 and "standard input was empty" in refused.stderr
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 au lait".encode("latin-1"))  # not UTF-8: read with U+FFFD, no traceback
    assert prompt_tokens("is", stdin=latin1).returncode == 0


def test_ctrl_c_ends_the_partial_answers_line(invoke, tiny_store, monkeypatch):
    from ollama_spec.engine.generation import Generation

    def interrupted(self):
        yield "a partial answer"
        raise KeyboardInterrupt

    monkeypatch.setattr(Generation, "__iter__", interrupted)
    result = gen(invoke, tiny_store, "tiny-target", "Hi", "-n", "5")
    assert result.exit_code == 130
    assert result.stdout == "a partial answer\n" and result.stderr.strip() == "Interrupted."
