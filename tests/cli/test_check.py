import json

import pytest

from ollama_spec.llama import backends
from ollama_spec.models.gguf_info import format_bytes
from ollama_spec.planning.devices import CUDA_RESERVE, GIB, MIB, Device, nvidia_gpu, system_ram


@pytest.fixture
def machine(monkeypatch):
    """Plan for the devices and CPU a test sets, never for the machine the tests run on."""
    devices: list[Device] = [nvidia_gpu(8), system_ram(32)]
    monkeypatch.setattr(backends, "discover_devices", lambda: (list(devices), []))
    monkeypatch.setattr(backends, "cpu_features", lambda: frozenset())
    monkeypatch.setenv("OLLAMA_SPEC_REPACK", "1")  # no canary run: these tests are about the plan
    return devices


def test_help_has_examples(invoke):
    result = invoke("check", "-h")
    assert result.exit_code == 0 and "Examples:" in result.output and "--kv-type [f16|q8_0|q4_0]" in result.output


def test_pair_fits_on_a_gpu(invoke, tiny_store, machine):
    result = invoke("check", "tiny-target", "--draft", "tiny-draft", "--ctx", "2048", "--models-dir", tiny_store)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "target  tiny-target:latest  (213.6K F32, 4 layers, trained context 8192)"
    assert lines[1] == "  weights     706.2 KiB  (+ 128.0 KiB token embeddings, kept in RAM)"
    assert lines[2] == "  KV cache      1.0 MiB  (2048 tokens, f16)"
    assert lines[5].startswith("draft   tiny-draft:latest  (102.6K F32, 1 layer, ")
    assert lines[-1] == "verdict: fits with full offload: 8.7 MiB of 7.6 GiB usable GPU memory"
    assert result.stderr == ""


def test_json(invoke, tiny_store, machine):
    result = invoke("check", "tiny-target", "-d", "tiny-draft", "--json", "--models-dir", tiny_store)
    data = json.loads(result.stdout)
    assert data["verdict"] == "full_offload" and data["gpu_layers"] == -1 and data["n_ctx"] == 4096
    assert (data["target"]["model"], data["draft"]["model"]) == ("tiny-target:latest", "tiny-draft:latest")
    assert data["target"]["kv_cache"] == 4 * 4096 * 32 * 2 * 2
    assert [d["kind"] for d in data["devices"]] == ["cuda", "cpu"]


def test_does_not_fit_exits_1_with_the_verdict(invoke, tiny_store, machine):
    machine[:] = [Device("small GPU", "cuda", 4 * MIB, 4 * MIB), Device("CPU RAM", "cpu", 4 * MIB, 4 * MIB)]
    result = invoke("check", "tiny-target", "-d", "tiny-draft", "--ctx", "8192", "--models-dir", tiny_store)
    assert result.exit_code == 1
    assert result.stdout.splitlines()[-2:] == [
        (
            "verdict: does not fit: target and draft need 24.5 MiB of GPU memory with full offload, 4.0 MiB usable, "
            "and no layer split fits in 4.0 MiB of RAM"
        ),
        "  try: --ctx 256 fits with full offload",
    ]
    as_json = invoke("check", "tiny-target", "--ctx", "8192", "--json", "--models-dir", tiny_store)
    assert as_json.exit_code == 1 and json.loads(as_json.stdout)["fits"] is False


def test_no_gpu_plans_for_ram_and_says_why(invoke, tiny_store, monkeypatch, machine):
    note = "no GPU found: planning for CPU RAM"
    monkeypatch.setattr(backends, "discover_devices", lambda: ([system_ram(16)], [note]))
    result = invoke("check", "tiny-target", "--models-dir", tiny_store)
    assert result.exit_code == 0
    assert result.stdout.splitlines()[-1] == "verdict: fits in CPU RAM: 43.6 MiB of 16.0 GiB available (no GPU used)"
    assert result.stderr == f"warning: {note}\n"


def test_layer_split_for_a_70b_shape(invoke, sparse_dir, machine):
    from ollama_spec.models.gguf_info import read_model_info
    from ollama_spec.synthetic.models import Architecture
    from tests.builders.shapes import write_shape_only_gguf
    from tests.planning.test_memory import _expected_gpu_layers

    arch = Architecture(n_embd=8192, n_layer=80, n_head=64, n_kv_head=8, n_ff=28672, context_length=131072)
    path = sparse_dir / "check-70b.gguf"
    write_shape_only_gguf(path, name="big", arch=arch, vocab_size=128256)
    machine[:] = [nvidia_gpu(24), system_ram(64)]
    result = invoke("check", path, "--ctx", "8192")
    assert result.exit_code == 0
    layers = _expected_gpu_layers(read_model_info(path, read_vocab=False), None, 8192, 24 * GIB - CUDA_RESERVE)
    assert f"verdict: fits only with {layers} of 81 target layers on the GPU (n_gpu_layers={layers})" in result.stdout


def test_repacked_copy_is_counted_and_said(invoke, tiny_store, machine, monkeypatch):
    machine[:] = [system_ram(16)]
    monkeypatch.setattr(backends, "cpu_features", lambda: frozenset({"AVX2", "REPACK"}))
    q4 = invoke("check", "tiny-target:q4_0", "--ctx", "512", "--models-dir", tiny_store)
    assert q4.exit_code == 0
    # every layer matrix and the output matrix: 213,568 - 512 x 64 embeddings - 9 x 64 norms values, Q4_0
    repacked = (213_568 - 512 * 64 - 9 * 64) // 32 * 18
    assert (
        f"  repacked {format_bytes(repacked):>12}  (llama.cpp's copy for this CPU's kernels; --no-repack skips it)"
        in q4.stdout.splitlines()
    )
    without = invoke("check", "tiny-target:q4_0", "--ctx", "512", "--no-repack", "--json", "--models-dir", tiny_store)
    data = json.loads(without.stdout)
    assert data["host_repacked"] == 0 and data["repack"] is False
    assert data["repack_decision"] == {
        "enabled": False,
        "source": "--repack/--no-repack",
        "detail": "forced on the command line",
    }
    q8 = invoke("check", "tiny-target:q8_0", "--ctx", "512", "--models-dir", tiny_store)
    assert "repacked" not in q8.stdout  # AVX2 has no Q8_0 kernel


def test_context_beyond_training_warns_and_continues(invoke, tiny_store, machine):
    result = invoke("check", "tiny-target", "--ctx", "16384", "--models-dir", tiny_store)
    assert result.exit_code == 0 and "verdict: fits with full offload" in result.stdout
    assert result.stderr == (
        "warning: --ctx 16384 is larger than tiny-target's trained context (8192 tokens); "
        "output quality may drop past it\n"
    )


def test_errors_are_one_line_with_nonzero_exit(invoke, tiny_store, tmp_path, machine):
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"junk" * 8)
    cases = {
        ("tiny-target", "--ctx", "0"): "Error: --ctx must be a positive number of tokens, got 0",
        ("tiny-target", "--ctx", "-5"): "Error: --ctx must be a positive number of tokens, got -5",
        ("tiny-target", "--kv-type", "q8_0"): "Error: --kv-type q8_0 needs attention heads whose size is a multiple "
        "of 32, but tiny-target has 16; use --kv-type f16",
        ("nothere",): f"Error: model 'nothere' not found in {tiny_store} (from --models-dir); "
        "pull it with 'ollama-spec pull nothere'",
        ("tiny-target", "-d", "nothere"): f"Error: model 'nothere' not found in {tiny_store} (from --models-dir); "
        "pull it with 'ollama-spec pull nothere'",
        (str(junk),): f"Error: {junk} is not a GGUF file (it starts with b'junk')",
    }
    for args, message in cases.items():
        result = invoke("check", *args, "--models-dir", tiny_store)
        assert (result.exit_code, result.output.strip()) == (1, message), args
    bad_type = invoke("check", "tiny-target", "--kv-type", "q5_1", "--models-dir", tiny_store)
    assert bad_type.exit_code == 2 and "Invalid value for '--kv-type': 'q5_1' is not one of" in bad_type.output


def test_a_short_gpu_lists_what_ollama_holds_and_how_to_free_it(invoke, tiny_store, machine, monkeypatch):
    from tests.fake_ollama import fake_daemon, ps_entry

    machine[:] = [Device("GPU 0", "cuda", 8 * GIB, 2 * MIB), system_ram(32)]
    with fake_daemon([ps_entry("llama3.1:8b", 6, 5.5)]) as url:
        monkeypatch.setenv("OLLAMA_HOST", url)
        result = invoke("check", "tiny-target", "-d", "tiny-draft", "--ctx", "2048", "--models-dir", tiny_store)
        as_json = json.loads(invoke("check", "tiny-target", "--json", "--models-dir", tiny_store).stdout)
    assert result.exit_code == 1, result.output  # it does not fit while Ollama holds the GPU
    assert result.stdout.splitlines()[-3:] == [
        f"Ollama at {url} holds 5.5 GiB of GPU memory: llama3.1:8b (5.5 GiB)",
        "free it with: ollama stop llama3.1:8b",
        "or let Ollama unload models right after each request: OLLAMA_KEEP_ALIVE=0 (or keep_alive: 0 in the request)",
    ]
    assert as_json["ollama_daemon"]["models"][0]["name"] == "llama3.1:8b"


def test_the_daemon_is_not_asked_when_the_pair_fits(invoke, tiny_store, machine, monkeypatch):
    from ollama_spec.cli import check as check_module

    monkeypatch.setattr(check_module, "daemon_status", lambda: pytest.fail("asked the daemon"))
    assert invoke("check", "tiny-target", "--models-dir", tiny_store).exit_code == 0


def test_tensor_split_shares_are_shown_as_each_devices_part_of_the_target(invoke, tiny_store, machine):
    machine[:] = [nvidia_gpu(8, "GPU 0"), nvidia_gpu(8, "GPU 1"), system_ram(32)]
    result = invoke("check", "tiny-target", "-d", "tiny-draft", "--tensor-split", "3,1", "--models-dir", tiny_store)
    assert result.exit_code == 0, result.output
    shares = [
        line.split("; ")[1].split(" of the target")[0]
        for line in result.stdout.splitlines()
        if "GPU " in line and "of the target" in line
    ]
    assert shares == ["75%", "25%"]


def test_row_split_with_rpc_servers_is_refused_before_any_connection(invoke, tiny_store, machine):
    result = invoke("check", "tiny-target", "--split-mode", "row", "--rpc", "127.0.0.1:1", "--models-dir", tiny_store)
    assert result.exit_code == 1
    assert result.output.strip() == (
        "Error: --split-mode row splits matrices over one machine's GPUs only; "
        "llama.cpp's RPC servers take whole layers: use --split-mode layer (the "
        "default) with --rpc"
    )


def test_no_gpu_warning_is_dropped_when_rpc_servers_take_the_target(invoke, tiny_store, monkeypatch):
    monkeypatch.setenv("OLLAMA_SPEC_REPACK", "1")  # no canary run: this test is about the warnings
    from ollama_spec.cli import check as check_module
    from ollama_spec.planning.devices import rpc_device

    monkeypatch.setattr(
        backends, "discover_devices", lambda: ([system_ram(16)], ["no GPU found: planning for CPU RAM"])
    )
    monkeypatch.setattr(backends, "cpu_features", lambda: frozenset())
    monkeypatch.setattr(
        check_module,
        "remote_devices",
        lambda servers: (rpc_device("RPC0", servers[0], 8 * GIB, 8 * GIB),) if servers else (),
    )
    result = invoke("check", "tiny-target", "-d", "tiny-draft", "--rpc", "10.0.0.2:50052", "--models-dir", tiny_store)
    assert result.exit_code == 0, result.output
    assert "RPC0 at 10.0.0.2:50052" in result.stdout and result.stderr == ""


def test_slots_on_a_cpu_say_flash_attention_is_timed_then_what_was_timed(
    invoke, tiny_store, machine, monkeypatch, own_cache
):
    from ollama_spec.engine.calibration import StepCostCache
    from ollama_spec.engine.flash_choice import flash_key
    from ollama_spec.llama import load_params
    from ollama_spec.llama.model import LoadSettings
    from ollama_spec.models.resolve import resolve_model

    monkeypatch.setattr(load_params, "gpu_offload_supported", lambda: False)
    args = ("check", "tiny-target", "-d", "tiny-draft", "--ctx", "512", "--models-dir", tiny_store)
    first = invoke(*args, "--parallel", "2")
    assert "note: flash attention is timed on and off at the first load with 2 slots" in first.stderr
    assert "flash attention" not in invoke(*args).stderr  # one slot on a CPU: off, nothing to time
    assert "flash attention" not in invoke(*args, "--parallel", "2", "--flash-attn", "on").stderr
    path = resolve_model("tiny-target", str(tiny_store)).path
    timed = {"on": [0.0008, 0.0024], "off": [0.0003, 0.0007]}
    StepCostCache().put_flash_attention(flash_key(path, LoadSettings(n_ctx=512, n_seq=2)), "off", timed)
    again = invoke(*args, "--parallel", "2")
    assert "note: flash attention off (timed: a 4-token verify batch 0.80 ms on, 0.30 ms off" in again.stderr
    as_json = json.loads(invoke(*args, "--parallel", "2", "--json").stdout)
    assert as_json["flash_attention_note"].startswith("off (timed:")
