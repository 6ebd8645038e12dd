from ollama_spec import doctor as diagnosis
from ollama_spec.doctor import Facts, Problem, find_problems
from ollama_spec.models.daemon import DaemonStatus, HeldModel
from ollama_spec.planning.backends import BackendDevice, BackendReport
from ollama_spec.planning.devices import nvidia_gpu

GIB = 1 << 30
NO_DAEMON = DaemonStatus("http://127.0.0.1:11434", False, error="nothing answers there")
CPU = BackendDevice("CPU", "AMD EPYC", "cpu", 60 * GIB, 64 * GIB)


def facts(**kwargs) -> Facts:
    base = {
        "offload": True,
        "gpus": (),
        "backends": BackendReport(("CPU",), (CPU,)),
        "store": "/store",
        "store_error": None,
        "daemon": NO_DAEMON,
    }
    return Facts(**(base | kwargs))


def test_a_healthy_machine_has_no_problems():
    gpu = BackendDevice("CUDA0", "NVIDIA H200", "gpu", 139 * GIB, 140 * GIB)
    assert (
        find_problems(
            facts(gpus=(nvidia_gpu(140, "GPU 0: NVIDIA H200"),), backends=BackendReport(("CUDA", "CPU"), (gpu, CPU)))
        )
        == []
    )


def test_a_cpu_build_beside_an_nvidia_gpu_says_how_to_rebuild(monkeypatch):
    problems = find_problems(facts(offload=False, gpus=(nvidia_gpu(24, "GPU 0: RTX 4090"),)))
    assert problems == [
        Problem(
            "llama-cpp-python is a CPU-only build, so GPU 0: RTX 4090 is not used", diagnosis.rebuild_command("cuda")
        )
    ]
    assert problems[0].fix.startswith("make install BACKEND=cuda")  # the tests run from a checkout
    monkeypatch.setattr(diagnosis, "CHECKOUT", diagnosis.CHECKOUT / "not-here")
    assert diagnosis.rebuild_command("cuda").startswith('CMAKE_ARGS="-DGGML_CUDA=on" pip install')


def test_llama_cpp_seeing_fewer_gpus_than_nvml_is_a_problem():
    problems = find_problems(facts(gpus=(nvidia_gpu(24),)))
    assert len(problems) == 1 and "llama.cpp sees 0 GPU(s) but nvidia-ml-py reports 1" in problems[0].what
    assert problems[0].fix == "nvidia-smi"


def test_a_short_gpu_names_what_ollama_holds_and_how_to_free_it():
    daemon = DaemonStatus(
        "http://127.0.0.1:11434",
        True,
        (HeldModel("llama3.1:70b", 40 * GIB, 20 * GIB), HeldModel("llama3.2:1b", 2 * GIB, 2 * GIB)),
    )
    gpu = nvidia_gpu(24, "GPU 0", free_gib=2)
    seen = BackendReport(("CUDA", "CPU"), (BackendDevice("CUDA0", "", "gpu", 2 * GIB, 24 * GIB), CPU))
    [problem] = find_problems(facts(gpus=(gpu,), backends=seen, daemon=daemon))
    assert problem.what == (
        "GPU 0 has 2.0 GiB free of 24.0 GiB; Ollama holds llama3.1:70b (20.0 GiB), llama3.2:1b (2.0 GiB)"
    )
    assert problem.fix == "ollama stop llama3.1:70b && ollama stop llama3.2:1b"
    [other] = find_problems(facts(gpus=(gpu,), backends=seen))
    assert other.what.endswith("another process holds the rest") and other.fix.startswith("nvidia-smi")


def test_store_problems_have_their_fix():
    [missing] = find_problems(facts(store=None, store_error="no Ollama model store found"))
    assert missing.fix == "ollama-spec pull llama3.2:1b"
    [unreadable] = find_problems(facts(store=None, store_error="not readable", store_unreadable=True))
    assert unreadable.fix == "sudo usermod -aG ollama $USER"
    # a pull goes through the daemon, which stores by its own environment: the setting is what to fix
    [misdirected] = find_problems(facts(store=None, store_error="does not exist", store_setting="OLLAMA_MODELS"))
    assert misdirected.fix == "unset OLLAMA_MODELS  (or set it to the folder that holds blobs/ and manifests/)"
    [flag] = find_problems(facts(store=None, store_error="does not exist", store_setting="--models-dir"))
    assert flag.fix == "give --models-dir the folder that holds blobs/ and manifests/"
