"""How `generate` loads its models: GGUF paths without a store, drafts and targets refused before
loading, the memory check and the plan's layer split between GPU and RAM, and what a model's
manifest says beyond its weights (its draft, messages and params layers, a Go template alone), and what it
says while it loads, times -k auto and warms up."""

import json

import pytest

from tests.cli.test_generate import BASE, gen


def test_gguf_paths_work_without_a_store(invoke, tiny_models, tmp_path):
    import shutil

    target, draft = tmp_path / "target.gguf", tmp_path / "draft.gguf"
    shutil.copy(tiny_models[0].path, target)
    shutil.copy(tiny_models[1].path, draft)
    result = invoke("generate", target, "Hi", "-d", draft, *BASE, "-n", "5")
    assert result.exit_code == 0, result.output


def test_incompatible_draft_is_refused_before_loading(invoke, tiny_store, monkeypatch):
    from ollama_spec.engine import engine

    loads = []
    monkeypatch.setattr(engine, "LoadedModel", lambda *a, **k: loads.append(a))
    result = invoke("generate", "tiny-target", "hi", "-d", "tiny-alien", "--no-check", "--models-dir", tiny_store)
    assert result.exit_code == 1 and loads == []


def test_recurrent_target_is_refused_before_loading(invoke, tiny_store, tmp_path, monkeypatch):
    from ollama_spec.engine import engine
    from tests.builders.recurrent import write_mamba_gguf

    loads = []
    monkeypatch.setattr(engine, "LoadedModel", lambda *a, **k: loads.append(a))
    mamba = write_mamba_gguf(tmp_path / "mamba.gguf")
    result = invoke("generate", mamba, "hi", "-d", "tiny-draft", "--models-dir", tiny_store)
    assert result.exit_code == 1 and loads == []
    assert result.output.strip() == (
        "Error: tiny-draft:latest cannot draft for mamba.gguf: the target is a recurrent model (mamba) whose cache "
        "cannot drop rejected draft tokens; run it without a draft"
    )


def test_memory_check_refuses_what_cannot_fit_before_loading(invoke, tiny_store, monkeypatch):
    from ollama_spec.engine import engine
    from ollama_spec.llama import backends
    from ollama_spec.planning.devices import system_ram

    loads = []
    real_load = engine.LoadedModel
    monkeypatch.setattr(engine, "LoadedModel", lambda *a, **k: loads.append(a) or real_load(*a, **k))
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


@pytest.fixture
def loads(monkeypatch):
    """The (path, LoadSettings) of every model generate loads, in order; loading still happens."""
    from ollama_spec.engine import engine, flash_choice

    seen = []
    real = engine.LoadedModel

    def loaded(path, settings, *weights, **kwargs):
        seen.append((path, settings))
        return real(path, settings, *weights, **kwargs)

    for module in (engine, flash_choice):  # the draft, and the target (its flash attention chosen first)
        monkeypatch.setattr(module, "LoadedModel", loaded)
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
    # draft_num_predict: -k's default (a step near max_tokens drafts only what is left to write)
    assert max(map(int, data["k_chosen"])) == 2
    fixed = json.loads(gen(invoke, layered_store, "withdraft", "Hi", "--json", "-n", "12", "-k", "3").stdout)
    assert max(map(int, fixed["k_chosen"])) == 3
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


def test_generate_says_what_it_waits_on_and_its_json_stays_clean(invoke, tiny_store, monkeypatch, own_cache):
    """Loading, -k auto's first timing and --compare's warm-up each report on stderr while they last
    (here made slow, and the notes frequent); stdout holds the JSON alone."""
    import time

    from ollama_spec.cli import common
    from ollama_spec.engine import costs
    from ollama_spec.engine import engine as engine_module
    from ollama_spec.engine.engine import Engine

    monkeypatch.setattr(common, "TICK_S", 0.02)
    monkeypatch.setattr(common, "PLAIN_EVERY_S", 0.0)
    monkeypatch.setattr(costs, "NOTICE_EVERY_S", 0.0)
    load, clear = engine_module.LoadedModel, Engine.clear_cache
    monkeypatch.setattr(engine_module, "LoadedModel", lambda *a, **k: time.sleep(0.1) or load(*a, **k))
    monkeypatch.setattr(Engine, "clear_cache", lambda self, *a, **k: time.sleep(0.1) or clear(self, *a, **k))
    result = gen(invoke, tiny_store, "tiny-target", "Hi", "-d", "tiny-draft", "--compare", "--json", "-n", "8")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["generated_tokens"] == 8 and "note:" not in result.stdout
    notes = result.stderr.splitlines()
    assert "note: loading tiny-target:latest and tiny-draft:latest: 0 s so far" in notes
    assert any(n.startswith("note: loading tiny-target:latest and tiny-draft:latest took ") for n in notes)
    assert any(n.startswith("note: timing steps for -k auto: 1 of ") for n in notes)
    assert any(n.startswith("note: timed this machine's steps for -k auto in ") for n in notes)
    assert "note: warming up both models (untimed): 0 s so far" in notes
    # in order: the load, then the timing, then the warm-up (none of them inside another)
    first = [next(i for i, n in enumerate(notes) if word in n) for word in ("loading", "timing", "warming")]
    assert first == sorted(first)
