"""The memory plan: arithmetic, verdicts, devices, and accuracy against what llama.cpp allocates."""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path

import pytest
from gguf import GGMLQuantizationType

from ollama_spec import devices as devices_module
from ollama_spec import runtime
from ollama_spec.devices import CUDA_BUILD_HINT, CUDA_RESERVE, GIB, MIB, Device, nvidia_gpu, system_ram
from ollama_spec.errors import InsufficientMemory, InvalidSetting
from ollama_spec.gguf_info import read_model_info
from ollama_spec.memory import (
    CPU_ONLY,
    DOES_NOT_FIT,
    FULL_OFFLOAD,
    PARTIAL_OFFLOAD,
    ensure_fits,
    kv_cache_bytes,
    model_needs,
    plan_memory,
)
from ollama_spec.store import Store, StoreRoot
from ollama_spec.synthetic.models import Architecture, WeightRecipe, make_weights, write_gguf
from ollama_spec.synthetic.shapes import write_shape_only_gguf
from ollama_spec.synthetic.tokenizer import build_vocabulary

README = Path(__file__).resolve().parent.parent / "README.md"
LLAMA_70B = Architecture(n_embd=8192, n_layer=80, n_head=64, n_kv_head=8, n_ff=28672, context_length=131072)
LLAMA_1B = Architecture(n_embd=2048, n_layer=16, n_head=32, n_kv_head=8, n_ff=8192, context_length=131072)
LLAMA3_VOCAB = 128256


@pytest.fixture(scope="module")
def llama_pair(tmp_path_factory):
    """Header-only llama3.1:70b Q4_K_M and llama3.2:1b Q8_0 (Ollama's default tags)."""
    root = tmp_path_factory.mktemp("shapes")
    write_shape_only_gguf(root / "70b.gguf", name="llama3.1:70b", arch=LLAMA_70B, vocab_size=LLAMA3_VOCAB)
    write_shape_only_gguf(root / "1b.gguf", name="llama3.2:1b", arch=LLAMA_1B, vocab_size=LLAMA3_VOCAB,
                          weight_type=GGMLQuantizationType.Q8_0, tied_embeddings=True)
    return read_model_info(root / "70b.gguf", read_vocab=False), read_model_info(root / "1b.gguf", read_vocab=False)


def machine(gpu_gib: float) -> list[Device]:
    return [nvidia_gpu(gpu_gib), system_ram(64)]


# --- arithmetic ------------------------------------------------------------------------------
def test_kv_cache_is_layers_ctx_kv_width_two_element_size(llama_pair):
    target, draft = llama_pair
    # 80 layers x 8192 cells x (8 KV heads x 128) x K and V x 2 bytes
    assert kv_cache_bytes(target, 8192) == 80 * 8192 * 1024 * 2 * 2 == 2.5 * GIB
    assert kv_cache_bytes(target, 8192, "q8_0") == 80 * 8192 * 1024 * 2 * 34 // 32
    assert kv_cache_bytes(target, 8192, "q4_0") == 80 * 8192 * 1024 * 2 * 18 // 32
    assert kv_cache_bytes(draft, 8192) == 16 * 8192 * 512 * 2 * 2
    assert kv_cache_bytes(target, 1000) == kv_cache_bytes(target, 1024)  # llama.cpp pads to 256 cells


def test_token_embeddings_stay_in_ram_and_tied_ones_are_copied(llama_pair):
    target, draft = llama_pair
    embd = {info: next(t.n_bytes for t in info.tensors if t.name == "token_embd.weight") for info in llama_pair}
    t, d = model_needs(target, 8192), model_needs(draft, 8192)
    assert t.host_weights == embd[target] and t.weights == target.tensor_bytes - embd[target]
    # The 1B has no output.weight: llama.cpp puts a copy of token_embd on the GPU as its output.
    assert d.host_weights == embd[draft] and d.weights == draft.tensor_bytes
    assert sum(t.layer_weights) + t.output_weights == t.weights and len(t.layer_weights) == 80


def test_compute_buffer_grows_with_context_only_through_the_mask(llama_pair):
    target, _ = llama_pair
    # Llama 3's 128k vocabulary makes the 512 x vocab logits the peak: 512 x 4 x (128256 + 2 x 8192).
    assert model_needs(target, 8192).compute == 512 * 4 * (LLAMA3_VOCAB + 2 * 8192)
    assert model_needs(target, 131072).compute == 512 * 4 * (3 * 28672 + 4 * 8192 + 131072 // 2)
    assert model_needs(target, 100).compute == 256 * 4 * (LLAMA3_VOCAB + 2 * 8192)


# --- verdicts for the README's machines --------------------------------------------------------
def test_readme_verdicts_70b_with_1b_draft_at_8k(llama_pair):
    target, draft = llama_pair
    plans = {gib: plan_memory(target, draft, 8192, devices=machine(gib)) for gib in (24, 48, 80)}
    assert (plans[24].verdict, plans[24].gpu_layers) == (PARTIAL_OFFLOAD, 44)
    assert plans[48].verdict == plans[80].verdict == FULL_OFFLOAD and plans[48].suggestions == ()
    # the split is tight: one more layer (weights and KV) would not fit
    layer = model_needs(target, 8192).layer_weights[0] + model_needs(target, 8192).kv // 80
    assert plans[24].gpu_bytes <= 24 * GIB - CUDA_RESERVE < plans[24].gpu_bytes + layer
    assert plans[24].suggestions[0].startswith("--kv-type q8_0 puts 45 of 81 target layers on the GPU")


def test_readme_section_is_what_the_tool_prints(llama_pair):
    from ollama_spec.cli.check import render_plan

    target, draft = llama_pair
    readme = README.read_text(encoding="utf-8")
    models = [("llama3.1:70b", target), ("llama3.2:1b", draft)]
    for gib in (24, 48, 80):
        lines = render_plan(plan_memory(target, draft, 8192, devices=machine(gib)), models)
        shown = lines if gib == 24 else lines[lines.index("devices"):]  # the models' lines are the same
        for line in shown:
            assert line in readme, f"README is out of date: {line!r} (run the snippet in its Memory check section)"


def test_draft_is_kept_on_the_gpu_first(llama_pair):
    target, draft = llama_pair
    plan = plan_memory(target, draft, 8192, devices=machine(24))
    alone = plan_memory(target, None, 8192, devices=machine(24))
    assert plan.gpu_layers < alone.gpu_layers  # the draft's ~1.2 GiB comes out of the target's share
    assert plan.gpu_bytes - plan.draft.gpu_total <= alone.gpu_bytes


def test_does_not_fit_says_why_and_what_to_change(llama_pair):
    target, draft = llama_pair
    plan = plan_memory(target, draft, 8192, devices=[nvidia_gpu(8), system_ram(16)])
    assert plan.verdict == DOES_NOT_FIT and not plan.fits
    with pytest.raises(InsufficientMemory) as error:
        ensure_fits(plan)
    assert str(error.value) == (
        "does not fit: target and draft need 41.2 GiB of GPU memory with full offload, 7.6 GiB usable, "
        "and no layer split fits in 16.0 GiB of RAM; use a smaller quantization of the target, a smaller draft, "
        "or a machine with more memory"
    )
    assert "\n" not in str(error.value)


def test_largest_context_suggestion_is_the_edge(llama_pair):
    target, draft = llama_pair
    devices = machine(48)
    plan = plan_memory(target, draft, 32768, devices=devices)
    assert plan.verdict == PARTIAL_OFFLOAD
    ctx = int(re.match(r"--ctx (\d+) fits with full offload", plan.suggestions[0]).group(1))
    assert plan_memory(target, draft, ctx, devices=devices).verdict == FULL_OFFLOAD
    assert plan_memory(target, draft, ctx + 256, devices=devices).verdict == PARTIAL_OFFLOAD
    assert "--kv-type q8_0 fits with full offload (KV caches 5.8 GiB)" in plan.suggestions
    ensure_fits(plan)  # a layer split still runs


def test_two_gpus_add_up_and_cpu_only_plans_use_ram(llama_pair):
    target, draft = llama_pair
    assert plan_memory(target, draft, 8192, devices=[nvidia_gpu(24), nvidia_gpu(24)]).verdict == FULL_OFFLOAD
    cpu = plan_memory(target, draft, 8192, devices=[system_ram(64)])
    assert cpu.verdict == CPU_ONLY and cpu.gpu_layers is None
    assert cpu.host_bytes == model_needs(target, 8192).cpu_total + model_needs(draft, 8192).cpu_total
    small = plan_memory(target, draft, 8192, devices=[system_ram(32)])
    assert small.verdict == DOES_NOT_FIT
    assert small.summary == "does not fit: needs 41.7 GiB of RAM, 32.0 GiB available"


def test_bad_settings_are_refused(llama_pair, tiny_store):
    target, draft = llama_pair
    for n_ctx in (0, -8):
        with pytest.raises(InvalidSetting, match=rf"^--ctx must be a positive number of tokens, got {n_ctx}$"):
            plan_memory(target, draft, n_ctx, devices=machine(24))
    with pytest.raises(InvalidSetting, match="unknown KV cache type 'q5_1': use one of f16, q8_0, q4_0"):
        plan_memory(target, draft, 8192, "q5_1", devices=machine(24))
    tiny = read_model_info(_tiny_path(tiny_store, "tiny-target"))
    with pytest.raises(InvalidSetting, match="size is a multiple of 32, but tiny-target has 16; use --kv-type f16"):
        plan_memory(tiny, None, 1024, "q8_0", devices=machine(24))
    with pytest.raises(InvalidSetting, match="no devices"):
        plan_memory(target, None, 1024, devices=[])


def test_context_beyond_training_is_a_warning(tiny_store):
    tiny = read_model_info(_tiny_path(tiny_store, "tiny-target"))
    plan = plan_memory(tiny, None, 16384, devices=machine(24))
    assert plan.fits
    assert plan.warnings == (
        "--ctx 16384 is larger than tiny-target's trained context (8192 tokens); output quality may drop past it",
    )


def test_plan_json_has_the_numbers(llama_pair):
    target, draft = llama_pair
    data = plan_memory(target, draft, 8192, devices=machine(24)).to_json()
    assert data["verdict"] == "partial_offload" and data["gpu_layers"] == 44 and data["target_layer_count"] == 81
    assert data["target"]["kv_cache"] == 2.5 * GIB and data["devices"][0]["reserve"] == CUDA_RESERVE


# --- device discovery ------------------------------------------------------------------------
def _fake_pynvml(fail_init: bool = False) -> types.ModuleType:
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init():
        if fail_init:
            raise NVMLError("Driver Not Loaded")

    nvml.NVMLError = NVMLError
    nvml.nvmlInit, nvml.nvmlShutdown = init, lambda: None
    nvml.nvmlDeviceGetCount = lambda: 2
    nvml.nvmlDeviceGetHandleByIndex = lambda i: i
    nvml.nvmlDeviceGetName = lambda h: b"NVIDIA GeForce RTX 4090"
    nvml.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=24 * GIB, free=(20 + h) * GIB)
    return nvml


def test_nvidia_gpus_are_found_through_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    monkeypatch.setattr(devices_module, "_gpu_offload_supported", lambda: True)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    found, notes = devices_module.discover_devices()
    assert [(d.name, d.kind, d.free) for d in found[:-1]] == [("GPU 1: NVIDIA GeForce RTX 4090", "cuda", 21 * GIB)]
    assert found[-1].kind == "cpu" and notes == []


def test_a_cpu_only_llama_cpp_build_is_said_plainly(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml())
    monkeypatch.setattr(devices_module, "_gpu_offload_supported", lambda: False)
    found, notes = devices_module.discover_devices()
    assert [d.kind for d in found] == ["cpu"]
    assert len(notes) == 1
    assert notes[0] == ("llama-cpp-python was built without GPU support, so the NVIDIA GPU found here is not used "
                        f"and the plan is for CPU RAM; rebuild it with: {CUDA_BUILD_HINT}")


@pytest.mark.parametrize("nvml", [None, "fail"])
def test_no_nvml_or_no_driver_means_cpu_ram(monkeypatch, nvml):
    # None in sys.modules makes `import pynvml` raise ImportError.
    monkeypatch.setitem(sys.modules, "pynvml", None if nvml is None else _fake_pynvml(fail_init=True))
    monkeypatch.setattr(devices_module, "_gpu_offload_supported", lambda: False)
    monkeypatch.setattr(devices_module, "_apple_gpu", list)
    found, notes = devices_module.discover_devices()
    assert [d.kind for d in found] == ["cpu"] and found[0].total > 0
    assert notes == ["no GPU found: planning for CPU RAM"]


# --- accuracy against llama.cpp's own allocations --------------------------------------------
_BUFFER = re.compile(r"(\S+) +(model|KV|compute) buffer size = +([\d.]+) MiB")


def _llama_cpp_buffers(path: Path, n_ctx: int) -> dict[str, float]:
    """MiB llama.cpp logs for the model (mapped weights), KV cache and compute buffers."""
    runtime.clear_log()
    with runtime.LoadedModel(path, runtime.LoadSettings(n_ctx=n_ctx)):
        pass
    sizes = {"model": 0.0, "KV": 0.0, "compute": 0.0}
    for line in runtime.recent_log():
        if match := _BUFFER.search(line):
            sizes[match.group(2)] += float(match.group(3))
    return sizes


def _tiny_path(store: Path, name: str) -> Path:
    return Store(StoreRoot(store, "test")).resolve(name).gguf_path


@pytest.fixture(scope="module")
def mid_models(tmp_path_factory) -> dict[str, Path]:
    """F16 models big enough that llama.cpp's fixed overheads don't hide the estimate's error.

    `ffn` peaks inside a layer (feed-forward 3.5x the embedding, like Llama); `logits` peaks at
    the output, like Llama 3 with its 128k vocabulary.
    """
    root = tmp_path_factory.mktemp("mid")
    shapes = {
        "ffn": (Architecture(n_embd=1024, n_layer=4, n_head=16, n_kv_head=4, n_ff=3584), 4096),
        "logits": (Architecture(n_embd=512, n_layer=2, n_head=8, n_kv_head=2, n_ff=1792), 16384),
    }
    paths = {}
    for name, (arch, vocab_size) in shapes.items():
        vocab = build_vocabulary(vocab_size, 600)
        weights = make_weights(arch, vocab.size, WeightRecipe(seed=11, dtype="F16"), 1)
        paths[name] = root / f"{name}.gguf"
        write_gguf(paths[name], name=name, arch=arch, n_layer=arch.n_layer, vocab=vocab, weights=weights, dtype="F16")
    return paths


@pytest.mark.parametrize("model,n_ctx", [
    ("tiny-target", 1024), ("tiny-target", 8192),
    ("ffn", 256), ("ffn", 1000), ("ffn", 2048), ("ffn", 8192),
    ("logits", 512), ("logits", 4096), ("logits", 8192),
])
def test_estimate_within_10_percent_of_llama_cpp(model, n_ctx, mid_models, tiny_store):
    path = mid_models.get(model) or _tiny_path(tiny_store, model)
    needs = model_needs(read_model_info(path), n_ctx)
    logged = _llama_cpp_buffers(path, n_ctx)
    estimate = {"model": needs.file_weights / MIB, "KV": needs.kv / MIB, "compute": needs.compute / MIB}
    print(f"{model} ctx={n_ctx}: " + ", ".join(f"{k} {estimate[k]:.2f} vs {logged[k]:.2f} MiB" for k in logged))
    for kind in ("model", "KV", "compute"):
        assert logged[kind] > 0, f"llama.cpp logged no {kind} buffer"
        assert estimate[kind] == pytest.approx(logged[kind], rel=0.10), kind
