import json
from importlib.metadata import version

from ollama_spec.cli import doctor as doctor_module
from ollama_spec.planning.devices import nvidia_gpu, system_ram


def test_doctor_reports_llama_cpp_devices_and_the_repack_verdict(invoke, monkeypatch, tiny_store):
    from ollama_spec import doctor as diagnosis

    monkeypatch.setattr(doctor_module, "discover_devices", lambda: ([nvidia_gpu(24), system_ram(64)], []))
    monkeypatch.setattr(diagnosis, "present_gpus", list)
    monkeypatch.setenv("OLLAMA_SPEC_REPACK", "0")
    result = invoke("doctor", "--models-dir", tiny_store)  # a store, and no GPU to miss: no problem
    assert result.exit_code == 0, result.output
    assert result.stdout.endswith("problems          none\n")
    lines = result.stdout.splitlines()
    assert lines[0] == f"llama-cpp-python  {version('llama-cpp-python')}"
    assert lines[1].startswith("GPU offload       ")
    assert lines[2:5] == [
        "devices",
        "  24 GiB GPU                     23.6 GiB usable of 24.0 GiB",
        "  CPU RAM                        64.0 GiB usable of 64.0 GiB",
    ]
    assert lines[5] == (
        "repack            off: OLLAMA_SPEC_REPACK=0 (OLLAMA_SPEC_REPACK; force with "
        "--repack/--no-repack or OLLAMA_SPEC_REPACK=1/0)"
    )
    assert lines[6].startswith("CPU features      ")


def test_doctor_json_runs_the_canary_once(invoke, monkeypatch):
    note = "no GPU found: planning for CPU RAM"
    monkeypatch.setattr(doctor_module, "discover_devices", lambda: ([system_ram(8)], [note]))
    data = json.loads(invoke("doctor", "--json").stdout)
    assert data["notes"] == [note] and [d["kind"] for d in data["devices"]] == ["cpu"]
    assert data["repack"]["source"] in ("canary", "cached canary", "not built in")
    again = json.loads(invoke("doctor", "--json").stdout)
    assert again["repack"]["source"] in ("cached canary", "not built in")
    assert again["repack"]["enabled"] == data["repack"]["enabled"]


def test_doctor_lists_backends_store_daemon_and_problems_with_fixes(invoke, monkeypatch, tiny_store):
    from ollama_spec import doctor as diagnosis
    from tests.fake_ollama import fake_daemon, ps_entry

    gpu = nvidia_gpu(24, "GPU 0: RTX 4090", free_gib=3)
    monkeypatch.setattr(doctor_module, "discover_devices", lambda: ([system_ram(64)], []))
    monkeypatch.setattr(diagnosis, "present_gpus", lambda: [gpu])
    monkeypatch.setenv("OLLAMA_SPEC_REPACK", "0")
    monkeypatch.setenv("OLLAMA_MODELS", str(tiny_store))
    with fake_daemon([ps_entry("llama3.1:8b", 6, 5.5)]) as url:
        monkeypatch.setenv("OLLAMA_HOST", url)
        result = invoke("doctor")
        as_json = invoke("doctor", "--json")
        data = json.loads(as_json.stdout)
    assert result.exit_code == as_json.exit_code == 1, result.output  # problems found: scripts can tell
    out = result.stdout
    assert "\nbackends          CPU" in out and "\nllama.cpp sees\n  CPU " in out
    assert f"\nOllama store      {tiny_store}\n" in out
    assert f"\nOllama daemon     {url}: answers; holds llama3.1:8b (5.5 GiB on the GPU, 6.0 GiB in all)\n" in out
    assert out.endswith(
        "problems\n"
        "  - llama-cpp-python is a CPU-only build, so GPU 0: RTX 4090 is not used\n"
        f"    fix: {diagnosis.rebuild_command('cuda')}\n"
        "  - GPU 0: RTX 4090 has 3.0 GiB free of 24.0 GiB; Ollama holds llama3.1:8b (5.5 GiB)\n"
        "    fix: ollama stop llama3.1:8b\n"
    )
    assert [p["fix"] for p in data["problems"]] == [diagnosis.rebuild_command("cuda"), "ollama stop llama3.1:8b"]
    assert data["backends"]["backends"] == ["CPU", "RPC"] and data["ollama_daemon"]["reachable"] is True
    assert data["store"] == str(tiny_store) and data["gpus_present"][0]["name"] == "GPU 0: RTX 4090"


def test_a_bad_ollama_models_is_fixed_by_the_setting_not_a_pull(invoke, monkeypatch, tmp_path):
    from ollama_spec import doctor as diagnosis

    monkeypatch.setattr(doctor_module, "discover_devices", lambda: ([system_ram(64)], []))
    monkeypatch.setattr(diagnosis, "present_gpus", list)
    monkeypatch.setenv("OLLAMA_SPEC_REPACK", "0")
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path / "nowhere"))
    result = invoke("doctor")
    assert result.exit_code == 1
    assert result.stdout.endswith(
        f"problems\n  - the model store {tmp_path / 'nowhere'} (from OLLAMA_MODELS) does not exist or is not a "
        "directory\n    fix: unset OLLAMA_MODELS  (or set it to the folder that holds blobs/ and manifests/)\n"
    )
