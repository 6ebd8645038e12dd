import json
from importlib.metadata import version

from ollama_spec.cli import doctor as doctor_module
from ollama_spec.devices import nvidia_gpu, system_ram


def test_doctor_reports_llama_cpp_devices_and_the_repack_verdict(invoke, monkeypatch):
    monkeypatch.setattr(doctor_module, "discover_devices", lambda: ([nvidia_gpu(24), system_ram(64)], []))
    monkeypatch.setenv("OLLAMA_SPEC_REPACK", "0")
    result = invoke("doctor")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == f"llama-cpp-python  {version('llama-cpp-python')}"
    assert lines[1].startswith("GPU offload       ")
    assert lines[2:5] == ["devices", "  24 GiB GPU                     23.6 GiB usable of 24.0 GiB",
                          "  CPU RAM                        64.0 GiB usable of 64.0 GiB"]
    assert lines[5] == ("repack            off: OLLAMA_SPEC_REPACK=0 (OLLAMA_SPEC_REPACK; force with "
                        "--repack/--no-repack or OLLAMA_SPEC_REPACK=1/0)")
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
