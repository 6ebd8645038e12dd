"""The memory plan: arithmetic, verdicts, and accuracy against what llama.cpp allocates."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ollama_spec.errors import InsufficientMemory, InvalidSetting
from ollama_spec.llama import load_params
from ollama_spec.llama import log as llama_log
from ollama_spec.llama import model as runtime
from ollama_spec.llama.backends import cpu_features
from ollama_spec.llama.canary import decide_repack
from ollama_spec.models.gguf_info import TensorInfo, read_model_info
from ollama_spec.models.store import Store, StoreRoot
from ollama_spec.planning.devices import CUDA_RESERVE, GIB, MIB, Device, nvidia_gpu, system_ram
from ollama_spec.planning.kv_cache import kv_cache_bytes
from ollama_spec.planning.memory import (
    CPU_ONLY,
    DOES_NOT_FIT,
    FULL_OFFLOAD,
    PARTIAL_OFFLOAD,
    ensure_fits,
    plan_memory,
)
from ollama_spec.planning.needs import model_needs
from ollama_spec.planning.repack import repacked_bytes
from ollama_spec.synthetic.models import Architecture, WeightRecipe, make_weights, write_gguf
from ollama_spec.synthetic.tokenizer import build_vocabulary
from tests import placement
from tests.builders.shapes import write_shape_only_gguf

README = Path(__file__).resolve().parents[2] / "docs" / "memory.md"  # its Memory check section
LLAMA_70B = Architecture(n_embd=8192, n_layer=80, n_head=64, n_kv_head=8, n_ff=28672, context_length=131072)
LLAMA_1B = Architecture(n_embd=2048, n_layer=16, n_head=32, n_kv_head=8, n_ff=8192, context_length=131072)
LLAMA3_VOCAB = 128256


@pytest.fixture(scope="module")
def llama_pair(sparse_dir):
    """Header-only llama3.1:70b Q4_K_M and llama3.2:1b Q8_0 (Ollama's default tags)."""
    write_shape_only_gguf(sparse_dir / "mem-70b.gguf", name="llama3.1:70b", arch=LLAMA_70B, vocab_size=LLAMA3_VOCAB)
    write_shape_only_gguf(
        sparse_dir / "mem-1b.gguf",
        name="llama3.2:1b",
        arch=LLAMA_1B,
        vocab_size=LLAMA3_VOCAB,
        weight_type=GGMLQuantizationType.Q8_0,
        tied_embeddings=True,
    )
    return (
        read_model_info(sparse_dir / "mem-70b.gguf", read_vocab=False),
        read_model_info(sparse_dir / "mem-1b.gguf", read_vocab=False),
    )


def machine(gpu_gib: float) -> list[Device]:
    return [nvidia_gpu(gpu_gib), system_ram(64)]


def plan(target, draft, n_ctx, kv_type="f16", **kwargs):
    """A plan that does not depend on this machine's CPU: no repacked copy unless features are given."""
    return plan_memory(target, draft, n_ctx, kv_type, **({"features": frozenset()} | kwargs))


# --- arithmetic, against numbers worked by hand --------------------------------------------------
def test_kv_cache_sizes(llama_pair):
    target, draft = llama_pair
    # 70B: 80 layers x 8192 cells x 1024 (8 KV heads x 128) x 2 (K and V) x 2 bytes = 2.5 GiB
    assert kv_cache_bytes(target, 8192) == 2_684_354_560
    assert kv_cache_bytes(target, 8192, "q8_0") == 1_426_063_360  # 34 bytes per 32 values: x 17/32
    assert kv_cache_bytes(target, 8192, "q4_0") == 754_974_720  # 18 bytes per 32 values: x 9/32
    assert kv_cache_bytes(draft, 8192) == 268_435_456  # 16 layers x 8192 x 512 x 2 x 2 = 256 MiB


def test_token_embeddings_stay_in_ram_and_tied_ones_are_copied(llama_pair):
    target, draft = llama_pair
    t, d = model_needs(target, 8192), model_needs(draft, 8192)
    # token_embd: 128256 x 8192 Q4_K (144 bytes per 256 values) and 128256 x 2048 Q8_0 (34 per 32)
    assert t.host_weights == 591_003_648 and d.host_weights == 279_085_056
    assert t.weights == target.tensor_bytes - 591_003_648
    # The 1B has no output.weight: llama.cpp loads token_embd again, as its GPU output matrix.
    assert d.weights == draft.tensor_bytes and d.output_weights == 279_085_056 + 2048 * 4


def test_compute_buffer(llama_pair):
    target, _ = llama_pair
    # Llama 3's 128k vocabulary makes the logits the peak: 512 tokens x 4 bytes x (128256 + 2 x 8192).
    assert model_needs(target, 8192).compute == 296_222_720
    # At 128k context the f16 mask takes over: 512 x 4 x (3 x 28672 + 4 x 8192 + 131072 / 2)
    assert model_needs(target, 131072).compute == 377_487_360
    # A 100-token context pads to 256 cells, and the batch is 256 tokens: 256 x 4 x 144640
    assert model_needs(target, 100).compute == 148_111_360


# --- llama.cpp's layer placement (tests/placement.py, from its source) ---------------------------
@pytest.mark.parametrize("n_gpu_layers", [0, 1, 2, 3, 44, 79, 80, 81, 200])
def test_gpu_weights_follow_llama_cpp_placement(llama_pair, n_gpu_layers):
    for info in llama_pair:
        assert model_needs(info, 8192).gpu_weights(n_gpu_layers) == placement.gpu_weight_bytes(info, n_gpu_layers)


def test_one_gpu_layer_is_the_output_layer(llama_pair):
    target, _ = llama_pair
    assert placement.gpu_layer_indices(80, 1) == {80}  # index 80: the output layer
    assert placement.gpu_layer_indices(80, 3) == {78, 79, 80}
    needs = model_needs(target, 8192)
    output = 128256 * 8192 * 210 // 256 + 8192 * 4  # Q6_K output matrix and the F32 norm
    assert needs.gpu_weights(1) == output
    assert needs.gpu_weights(81) == needs.weights


_ASSIGNED = re.compile(r"layer +(\d+) assigned to device (\S+),")


def _assigned_devices(path: Path, n_gpu_layers: int) -> dict[int, str]:
    """llama.cpp's own per-layer placement, from its (debug) load log."""
    llama_log.clear_log()
    with runtime.LoadedModel(path, runtime.LoadSettings(n_ctx=256, n_threads=1, n_gpu_layers=n_gpu_layers)):
        pass
    return {int(m.group(1)): m.group(2) for line in llama_log.recent_log() if (m := _ASSIGNED.search(line))}


def test_llama_cpp_logs_a_device_for_every_layer_and_the_output(tiny_store):
    assigned = _assigned_devices(_tiny_path(tiny_store, "tiny-target"), 0)
    assert assigned == dict.fromkeys(range(5), "CPU")  # 4 layers and the output layer (index 4)


@pytest.mark.skipif(not load_params.gpu_offload_supported(), reason="a CPU-only llama.cpp puts every layer on the CPU")
@pytest.mark.parametrize("n_gpu_layers", [1, 2, 4, 5])
def test_placement_rule_is_what_llama_cpp_does(n_gpu_layers, tiny_store):
    assigned = _assigned_devices(_tiny_path(tiny_store, "tiny-target"), n_gpu_layers)
    assert {il for il, device in assigned.items() if device != "CPU"} == placement.gpu_layer_indices(4, n_gpu_layers)


def _expected_gpu_layers(target, draft, n_ctx, usable: int) -> int:
    """The largest n_gpu_layers whose GPU share fits, from the placement rule: weights of the placed
    layers, KV of the repeating ones, the compute buffer and room for one offloaded matrix."""
    t = model_needs(target, n_ctx)
    draft_gpu = model_needs(draft, n_ctx).gpu_total if draft else 0
    for g in range(target.block_count, 0, -1):
        repeating = len(placement.gpu_layer_indices(target.block_count, g) - {target.block_count})
        need = placement.gpu_weight_bytes(target, g) + t.kv // target.block_count * repeating
        if draft_gpu + need + t.compute + t.largest_layer_tensor <= usable:
            return g
    return 0


# --- verdicts for docs/memory.md's machines --------------------------------------------------------
def test_readme_verdicts_70b_with_1b_draft_at_8k(llama_pair):
    target, draft = llama_pair
    plans = {gib: plan(target, draft, 8192, devices=machine(gib)) for gib in (24, 48, 80)}
    expected = _expected_gpu_layers(target, draft, 8192, 24 * GIB - CUDA_RESERVE)
    assert (plans[24].verdict, plans[24].gpu_layers) == (PARTIAL_OFFLOAD, expected)
    assert plans[48].verdict == plans[80].verdict == FULL_OFFLOAD and plans[48].suggestions == ()
    assert plans[24].suggestions[0].startswith(f"--kv-type q8_0 puts {expected + 1} of 81 target layers on the GPU")


def test_readme_section_is_what_the_tool_prints(llama_pair):
    from ollama_spec.cli.check import render_plan

    target, draft = llama_pair
    readme = README.read_text(encoding="utf-8")
    models = [("llama3.1:70b", target), ("llama3.2:1b", draft)]
    for gib in (24, 48, 80):
        lines = render_plan(plan(target, draft, 8192, devices=machine(gib)), models)
        shown = lines if gib == 24 else lines[lines.index("devices") :]  # the models' lines are the same
        for line in shown:
            assert line in readme, (
                f"docs/memory.md is out of date: {line!r} (run the snippet in its Memory check section)"
            )


def test_readme_accuracy_claim_matches_the_tolerances():
    text = " ".join(README.read_text(encoding="utf-8").split())
    assert f"within {MODEL_KV_TOLERANCE:.0%} of the sizes llama.cpp logs" in text.replace(" %", "%")
    assert f"{TINY_COMPUTE_TOLERANCE:.0%} for the compute buffer of the tiny" in text.replace(" %", "%")


def test_draft_is_kept_on_the_gpu_first(llama_pair):
    target, draft = llama_pair
    with_draft = plan(target, draft, 8192, devices=machine(24))
    alone = plan(target, None, 8192, devices=machine(24))
    assert with_draft.gpu_layers < alone.gpu_layers  # the draft's ~1.2 GiB comes out of the target's share
    assert alone.gpu_layers == _expected_gpu_layers(target, None, 8192, 24 * GIB - CUDA_RESERVE)


def test_does_not_fit_says_why_and_what_to_change(llama_pair):
    target, draft = llama_pair
    verdict = plan(target, draft, 8192, devices=[nvidia_gpu(8), system_ram(16)])
    assert verdict.verdict == DOES_NOT_FIT and not verdict.fits
    with pytest.raises(InsufficientMemory) as error:
        ensure_fits(verdict)
    assert str(error.value) == (
        "does not fit: target and draft need 41.2 GiB of GPU memory with full offload, 7.6 GiB usable, "
        "and no layer split fits in 16.0 GiB of RAM; use a smaller quantization of the target, a smaller draft, "
        "or a machine with more memory"
    )
    assert "\n" not in str(error.value)


def test_largest_context_suggestion_is_the_edge(llama_pair):
    target, draft = llama_pair
    devices = machine(48)
    verdict = plan(target, draft, 32768, devices=devices)
    assert verdict.verdict == PARTIAL_OFFLOAD
    ctx = int(re.match(r"--ctx (\d+) fits with full offload", verdict.suggestions[0]).group(1))
    assert plan(target, draft, ctx, devices=devices).verdict == FULL_OFFLOAD
    assert plan(target, draft, ctx + 256, devices=devices).verdict == PARTIAL_OFFLOAD
    assert "--kv-type q8_0 fits with full offload (KV caches 5.8 GiB)" in verdict.suggestions
    ensure_fits(verdict)  # a layer split still runs


def test_two_gpus_add_up_and_cpu_only_plans_use_ram(llama_pair):
    target, draft = llama_pair
    assert plan(target, draft, 8192, devices=[nvidia_gpu(24), nvidia_gpu(24)]).verdict == FULL_OFFLOAD
    cpu = plan(target, draft, 8192, devices=[system_ram(64)], flash_attention=True)
    assert cpu.verdict == CPU_ONLY and cpu.gpu_layers is None
    # the whole files (mapped), KV caches, compute buffers, 16 rows of logits each
    files = target.tensor_bytes + draft.tensor_bytes
    # compute: the target's 512 x 4 x (128256 + 2 x 8192), the draft's 512 x 4 x (128256 + 2 x 2048)
    assert cpu.host_bytes == files + 2_684_354_560 + 268_435_456 + 296_222_720 + 271_056_896 + 2 * 16 * 128256 * 4
    # A CPU-only plan runs without flash attention by default (load_params.choose_flash_attention): every
    # head's f32 scores. Target: 512 x 4 x ((64 + 1) x 8192 + 5 x 8192 + 2 x 8 x 128 + 8) = 1,178,615,808;
    # draft: 512 x 4 x ((32 + 1) x 8192 + 5 x 2048 + 2 x 8 x 64 + 8) = 576,733,184.
    assert plan(target, draft, 8192, devices=[system_ram(64)]).host_bytes == (
        files + 2_684_354_560 + 268_435_456 + 1_178_615_808 + 576_733_184 + 2 * 16 * 128256 * 4
    )
    small = plan(target, draft, 8192, devices=[system_ram(32)], flash_attention=True)
    assert small.verdict == DOES_NOT_FIT
    assert small.summary == "does not fit: needs 41.7 GiB of RAM, 32.0 GiB available"


# --- llama.cpp's repacked CPU copy -------------------------------------------------------------
AVX2 = frozenset({"AVX2", "REPACK"})
ARM_DOTPROD = frozenset({"NEON", "DOTPROD", "REPACK"})
AMX = frozenset({"AVX2", "AVX512", "AMX_INT8", "REPACK"})
# every layer matrix of the 70B: 80 x (2 x 8192^2 + 2 x 1024 x 8192 + 3 x 28672 x 8192) values, Q4_K
LAYER_Q4_K = 80 * 855_638_016 * 144 // 256
OUTPUT_Q6_K = 128256 * 8192 * 210 // 256


def test_cpu_plan_counts_the_repacked_copy_where_llama_cpp_makes_one(llama_pair):
    target, _ = llama_pair
    devices = [system_ram(256)]
    assert plan(target, None, 8192, devices=devices).host_repacked == 0
    # AVX2 repacks Q4_K; Arm's dot-product kernels take the Q6_K output matrix too
    assert plan(target, None, 8192, devices=devices, features=AVX2).host_repacked == LAYER_Q4_K
    assert plan(target, None, 8192, devices=devices, features=ARM_DOTPROD).host_repacked == LAYER_Q4_K + OUTPUT_Q6_K
    with_copy = plan(target, None, 8192, devices=devices, features=AVX2)
    assert with_copy.host_bytes == plan(target, None, 8192, devices=devices).host_bytes + LAYER_Q4_K
    # repack off (canary failed, --no-repack): nothing to count
    assert plan(target, None, 8192, devices=devices, features=AVX2, repack=False).host_repacked == 0


def test_beside_a_cuda_gpu_cpu_layers_are_not_repacked(llama_pair):
    target, draft = llama_pair
    split = plan(target, draft, 8192, devices=machine(24), features=AVX2)
    assert split.verdict == PARTIAL_OFFLOAD and split.host_repacked == 0
    assert split.host_bytes == plan(target, draft, 8192, devices=machine(24)).host_bytes


def test_no_repack_is_suggested_when_it_makes_the_difference(llama_pair):
    target, _ = llama_pair
    verdict = plan(target, None, 8192, devices=[system_ram(50)], features=AVX2)
    assert verdict.verdict == DOES_NOT_FIT
    assert "--no-repack fits: it skips llama.cpp's repacked copy of the CPU weights (35.9 GiB)" in verdict.suggestions


def _tensor(name: str, shape: tuple[int, ...], type_name: str) -> TensorInfo:
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return TensorInfo(name, shape, type_name, shape[0] * shape[1] // block * size, 0)


def test_repack_rules_by_type_shape_and_cpu():
    q4 = _tensor("blk.0.ffn_up.weight", (4096, 1024), "Q4_0")  # 1024 rows
    q8 = _tensor("blk.0.ffn_up.weight", (4096, 1024), "Q8_0")
    f16 = _tensor("blk.0.attn_q.weight", (4096, 1024), "F16")
    assert repacked_bytes(q4, AVX2) == q4.n_bytes and repacked_bytes(q8, AVX2) == 0 == repacked_bytes(f16, AVX2)
    assert repacked_bytes(q8, ARM_DOTPROD) == q8.n_bytes
    assert repacked_bytes(_tensor("blk.0.attn_k.weight", (4096, 12), "Q4_0"), AVX2) == 0  # 12 rows: no 8-row tiles
    assert repacked_bytes(q4, frozenset({"AVX2"})) == 0  # a build without the repack buffer
    # AMX takes F16 as is, and Q8_0 with 4 bytes of sums per 32-value block: 1024 x 128 x 38
    assert repacked_bytes(f16, AMX) == f16.n_bytes and repacked_bytes(q8, AMX) == 1024 * 128 * 38
    # norms and the embedding lookup are never repacked; tied embeddings are, as the output matrix
    embd = _tensor("token_embd.weight", (4096, 1024), "Q4_0")
    assert repacked_bytes(embd, AVX2) == 0 and repacked_bytes(embd, AVX2, as_output=True) == embd.n_bytes


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
    data = plan(target, draft, 8192, devices=machine(24)).to_json()
    expected = _expected_gpu_layers(target, draft, 8192, 24 * GIB - CUDA_RESERVE)
    assert data["verdict"] == "partial_offload" and data["gpu_layers"] == expected and data["target_layer_count"] == 81
    assert data["target"]["kv_cache"] == 2_684_354_560 and data["devices"][0]["reserve"] == CUDA_RESERVE
    assert data["repack"] is True and data["host_repacked"] == 0


# --- accuracy against llama.cpp's own allocations --------------------------------------------
# What docs/memory.md promises; llama.cpp logs MiB with two decimals, hence the small absolute slack.
MODEL_KV_TOLERANCE = 0.01
TINY_COMPUTE_TOLERANCE = 0.06  # a fixed ~0.1 MiB on a 2 MiB buffer
_BUFFER = re.compile(r"(\S+) +(model|KV|compute) buffer size = +([\d.]+) MiB")
_CELLS = re.compile(r"llama_kv_cache: size = .*\( *(\d+) cells")
MAPPED_BUFFERS = ("CPU_Mapped", "CPU")


def _llama_cpp_buffers(
    path: Path, n_ctx: int, *, repack: bool = False, flash_attention: str = "auto"
) -> dict[str, float]:
    """MiB llama.cpp logs: the mapped/CPU weights ("model"), its extra repacked buffers ("extra"),
    KV cache and compute buffers, and the KV cells it chose for n_ctx."""
    llama_log.clear_log()
    settings = runtime.LoadSettings(n_ctx=n_ctx, n_threads=1, use_extra_bufts=repack, flash_attention=flash_attention)
    with runtime.LoadedModel(path, settings):
        pass
    sizes = {"model": 0.0, "extra": 0.0, "KV": 0.0, "compute": 0.0, "cells": 0}
    for line in llama_log.recent_log():
        if match := _BUFFER.search(line):
            kind = "extra" if match.group(2) == "model" and match.group(1) not in MAPPED_BUFFERS else match.group(2)
            sizes[kind] += float(match.group(3))
        elif match := _CELLS.search(line):
            sizes["cells"] = int(match.group(1))
    return sizes


def _tiny_path(store: Path, name: str) -> Path:
    return Store(StoreRoot(store, "test")).resolve(name).gguf_path


@pytest.fixture(scope="module")
def mid_models(tmp_path_factory) -> dict[str, Path]:
    """Models big enough that llama.cpp's fixed overheads don't hide the estimate's error.

    `ffn` peaks inside a layer (feed-forward 3.5x the embedding, like Llama); `logits` peaks at
    the output, like Llama 3 with its 128k vocabulary; `q4_0`/`q8_0` are `ffn` quantized.
    """
    root = tmp_path_factory.mktemp("mid")
    ffn = Architecture(n_embd=1024, n_layer=4, n_head=16, n_kv_head=4, n_ff=3584)
    shapes = {
        "ffn": (ffn, 4096, "F16"),
        "logits": (Architecture(n_embd=512, n_layer=2, n_head=8, n_kv_head=2, n_ff=1792), 16384, "F16"),
        "q4_0": (ffn, 4096, "Q4_0"),
        "q8_0": (ffn, 4096, "Q8_0"),
    }
    paths, made = {}, {}
    for name, (arch, vocab_size, dtype) in shapes.items():
        recipe = WeightRecipe(seed=11, dtype="F16" if dtype == "F16" else "F32")
        if (arch, vocab_size, recipe) not in made:  # q4_0 and q8_0 quantize the same F32 weights
            vocab = build_vocabulary(vocab_size, 600)
            made[arch, vocab_size, recipe] = vocab, make_weights(arch, vocab.size, recipe, 1)
        vocab, weights = made[arch, vocab_size, recipe]
        paths[name] = root / f"{name}.gguf"
        write_gguf(paths[name], name=name, arch=arch, n_layer=arch.n_layer, vocab=vocab, weights=weights, dtype=dtype)
    return paths


@pytest.mark.parametrize(
    "model,n_ctx",
    [
        ("tiny-target", 1024),
        ("tiny-target", 8192),
        ("ffn", 256),
        ("ffn", 1000),
        ("ffn", 2048),
        ("ffn", 8192),
        ("logits", 512),
        ("logits", 4096),
        ("logits", 8192),
        ("q4_0", 2048),
        ("q8_0", 2048),
    ],
)
def test_estimates_match_what_llama_cpp_allocates(model, n_ctx, mid_models, tiny_store):
    """Repacking off, so the weights are the mapped file on every CPU (the repacked copy is tested apart)."""
    path = mid_models.get(model) or _tiny_path(tiny_store, model)
    needs = model_needs(read_model_info(path), n_ctx)
    logged = _llama_cpp_buffers(path, n_ctx)
    estimate = {"model": needs.file_weights / MIB, "KV": needs.kv / MIB, "compute": needs.compute / MIB}
    print(f"{model} ctx={n_ctx}: " + ", ".join(f"{k} {estimate[k]:.2f} vs {logged[k]:.2f} MiB" for k in estimate))
    assert logged["extra"] == 0
    compute_tolerance = TINY_COMPUTE_TOLERANCE if model.startswith("tiny") else MODEL_KV_TOLERANCE
    for kind, tolerance in (("model", MODEL_KV_TOLERANCE), ("KV", MODEL_KV_TOLERANCE), ("compute", compute_tolerance)):
        assert logged[kind] > 0, f"llama.cpp logged no {kind} buffer"
        assert estimate[kind] == pytest.approx(logged[kind], rel=tolerance, abs=0.006), kind


@pytest.mark.parametrize("model,n_ctx", [("tiny-target", 4096), ("ffn", 2048), ("ffn", 8192), ("logits", 4096)])
def test_compute_without_flash_attention_matches_llama_cpp(model, n_ctx, mid_models, tiny_store):
    """Flash attention off (what a CPU gets by default): every head's f32 scores are materialised."""
    path = mid_models.get(model) or _tiny_path(tiny_store, model)
    info = read_model_info(path)
    estimate = model_needs(info, n_ctx, flash_attention=False).compute / MIB
    logged = _llama_cpp_buffers(path, n_ctx, flash_attention="off")["compute"]
    assert logged > model_needs(info, n_ctx).compute / MIB  # it does cost more than with flash attention
    assert logged <= estimate <= logged * 1.03  # never under; at most 3 % over


@pytest.mark.parametrize("n_ctx", [100, 257, 1000])
def test_context_is_padded_as_llama_cpp_pads_it(n_ctx, tiny_store):
    path = _tiny_path(tiny_store, "tiny-target")
    info = read_model_info(path)
    cells = _llama_cpp_buffers(path, n_ctx)["cells"]
    assert cells >= n_ctx
    assert kv_cache_bytes(info, n_ctx) == kv_cache_bytes(info, cells)  # the plan sizes the cells llama.cpp makes
    assert model_needs(info, n_ctx).compute == model_needs(info, cells).compute


@pytest.mark.parametrize("model", ["ffn", "q4_0", "q8_0"])
def test_repacked_copy_matches_llama_cpp_extra_buffers(model, mid_models):
    """On this machine's CPU, whatever it is: the AMX/CPU_REPACK buffers llama.cpp makes are what the plan counts."""
    if not decide_repack().enabled:
        pytest.skip("the canary found llama.cpp's repacked path unsafe on this machine")
    path = mid_models[model]
    predicted = model_needs(read_model_info(path), 2048, repack_features=cpu_features()).repacked / MIB
    logged = _llama_cpp_buffers(path, 2048, repack=True)["extra"]
    print(f"{model}: repacked {predicted:.2f} vs {logged:.2f} MiB logged ({' '.join(sorted(cpu_features()))})")
    assert predicted == pytest.approx(logged, rel=MODEL_KV_TOLERANCE, abs=0.05)


def test_a_context_past_the_trained_one_is_suggested_down_to_it(llama_pair):
    """More context than the model was trained on would fit, but says less: the suggestion stops there."""
    target, draft = llama_pair
    devices = machine(1000)  # room for more than the trained 131072 tokens, not for ten million
    verdict = plan(target, draft, 10_000_000, devices=devices)
    trained = target.context_length
    assert f"--ctx {trained} (the trained context) fits with full offload" in verdict.suggestions
