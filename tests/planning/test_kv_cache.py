"""Cache sizes of attention, recurrent and hybrid models: numbers worked by hand, and llama.cpp's own."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from ollama_spec.llama import log as llama_log
from ollama_spec.llama import model as runtime
from ollama_spec.models.architectures import HYBRID_ARCHS, RECURRENT_ARCHS, is_hybrid, is_recurrent
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.planning.devices import MIB, system_ram
from ollama_spec.planning.kv_cache import kv_cache_bytes, recurrent_layers, recurrent_state_bytes
from ollama_spec.planning.memory import CPU_ONLY, plan_memory
from ollama_spec.planning.needs import model_needs
from tests.builders.recurrent import write_mamba_gguf


def _header(path: Path, arch: str, keys: dict) -> Path:
    """A header-only GGUF of `arch` with these `{arch}.` keys, a 256-token vocabulary and an embedding."""
    writer = GGUFWriter(path, arch=arch)
    writer.add_name(path.stem)
    for key, value in keys.items():
        if isinstance(value, list):
            writer.add_array(f"{arch}.{key}", value)
        elif isinstance(value, float):
            writer.add_float32(f"{arch}.{key}", value)
        else:
            writer.add_uint32(f"{arch}.{key}", value)
    writer.add_token_list([f"t{i}" for i in range(256)])
    writer.add_tensor("token_embd.weight", np.zeros((256, keys["embedding_length"]), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_llama_cpp_lists_are_what_its_source_says():
    assert {"mamba", "mamba2", "rwkv6", "rwkv7"} <= RECURRENT_ARCHS
    assert {"jamba", "lfm2", "granitehybrid", "falcon-h1", "nemotron_h", "qwen3next"} <= HYBRID_ARCHS
    assert is_recurrent("mamba") and not is_hybrid("mamba") and is_hybrid("lfm2") and not is_recurrent("llama")


def test_mamba_has_a_fixed_state_and_no_kv_cache(tmp_path):
    # Mamba 130M: 24 layers of (d_conv - 1) x d_inner conv state + d_state x d_inner SSM state, f32
    info = read_model_info(
        _header(
            tmp_path / "mamba.gguf",
            "mamba",
            {
                "embedding_length": 768,
                "block_count": 24,
                "ssm.conv_kernel": 4,
                "ssm.inner_size": 1536,
                "ssm.state_size": 16,
                "ssm.time_step_rank": 48,
            },
        )
    )
    assert recurrent_state_bytes(info) == 24 * (3 * 1536 + 16 * 1536) * 4 == 2_801_664
    assert kv_cache_bytes(info, 8192) == 0
    assert model_needs(info, 8192).kv == model_needs(info, 256).kv == 2_801_664


def test_rwkv_state_is_token_shift_and_wkv(tmp_path):
    info = read_model_info(
        _header(tmp_path / "rwkv.gguf", "rwkv6", {"embedding_length": 2048, "block_count": 24, "wkv.head_size": 64})
    )
    assert recurrent_state_bytes(info) == 24 * (2 * 2048 + 2048 * 64) * 4 == 12_976_128


def test_jamba_attends_in_the_layers_with_kv_heads(tmp_path):
    heads_kv = [0, 0, 0, 0, 8, 0, 0, 0]
    info = read_model_info(
        _header(
            tmp_path / "jamba.gguf",
            "jamba",
            {
                "embedding_length": 4096,
                "block_count": 8,
                "attention.head_count": 32,
                "attention.head_count_kv": heads_kv,
                "feed_forward_length": 14336,
                "ssm.conv_kernel": 4,
                "ssm.inner_size": 8192,
                "ssm.state_size": 16,
            },
        )
    )
    assert recurrent_layers(info) == [h == 0 for h in heads_kv]
    assert kv_cache_bytes(info, 4096) == 4096 * 8 * (128 + 128) * 2 == 16_777_216  # one attention layer
    assert recurrent_state_bytes(info) == 7 * (3 * 8192 + 16 * 8192) * 4 == 4_358_144
    assert model_needs(info, 4096).kv == 16_777_216 + 4_358_144


def test_lfm2_short_convolutions(tmp_path):
    heads_kv = [0, 0, 8, 0, 0, 8]
    info = read_model_info(
        _header(
            tmp_path / "lfm2.gguf",
            "lfm2",
            {
                "embedding_length": 1024,
                "block_count": 6,
                "attention.head_count": 16,
                "attention.head_count_kv": heads_kv,
                "feed_forward_length": 6656,
                "shortconv.l_cache": 3,
            },
        )
    )
    assert recurrent_state_bytes(info) == 4 * 1024 * 2 * 4
    assert kv_cache_bytes(info, 1000) == 1024 * 2 * 8 * (64 + 64) * 2  # two layers, 1000 -> 1024 cells


def test_qwen3next_attends_every_fourth_layer_and_falcon_h1_in_all(tmp_path):
    qwen = read_model_info(
        _header(
            tmp_path / "q.gguf",
            "qwen3next",
            {
                "embedding_length": 2048,
                "block_count": 8,
                "attention.head_count": 16,
                "attention.head_count_kv": 2,
                "attention.key_length": 256,
                "feed_forward_length": 5120,
                "full_attention_interval": 4,
                "ssm.conv_kernel": 4,
                "ssm.inner_size": 4096,
                "ssm.state_size": 128,
                "ssm.group_count": 16,
            },
        )
    )
    assert recurrent_layers(qwen) == [True, True, True, False] * 2
    assert kv_cache_bytes(qwen, 256) == 256 * 2 * 2 * (256 + 256) * 2
    falcon = read_model_info(
        _header(
            tmp_path / "f.gguf",
            "falcon-h1",
            {
                "embedding_length": 1024,
                "block_count": 4,
                "attention.head_count": 8,
                "attention.head_count_kv": 2,
                "feed_forward_length": 2048,
                "ssm.conv_kernel": 4,
                "ssm.inner_size": 1536,
                "ssm.state_size": 16,
                "ssm.group_count": 1,
            },
        )
    )
    assert recurrent_layers(falcon) == [True] * 4
    assert kv_cache_bytes(falcon, 256) == 4 * 256 * 2 * (128 + 128) * 2
    assert recurrent_state_bytes(falcon) == 4 * (3 * (1536 + 2 * 16) + 16 * 1536) * 4


def test_check_sizes_a_mamba_model(invoke, tmp_path, monkeypatch):
    from ollama_spec.llama import backends

    path = write_mamba_gguf(tmp_path / "mamba.gguf")
    monkeypatch.setattr(backends, "discover_devices", lambda: ([system_ram(8)], []))
    monkeypatch.setenv("OLLAMA_SPEC_REPACK", "0")
    result = invoke("check", path, "--ctx", "4096")
    assert result.exit_code == 0, result.output
    # 2 layers x (3 x 128 + 16 x 128) values x 4 bytes
    assert "  state        19.0 KiB  (recurrent, the same at any context)" in result.stdout.splitlines()
    assert plan_memory(read_model_info(path), None, 4096, devices=[system_ram(8)], repack=False).verdict == CPU_ONLY


_LOGGED = re.compile(r"(RS|compute) buffer size = +([\d.]+) MiB")


@pytest.mark.parametrize("n_ctx", [256, 2048])
def test_mamba_state_and_compute_against_llama_cpp(tmp_path_factory, n_ctx):
    folder = tmp_path_factory.getbasetemp() / "mamba"
    folder.mkdir(exist_ok=True)
    path = folder / "mamba1024.gguf"
    if not path.exists():
        write_mamba_gguf(path, n_embd=1024, d_state=64)
    llama_log.clear_log()
    with runtime.LoadedModel(path, runtime.LoadSettings(n_ctx=n_ctx, n_threads=1)) as model:
        assert model.eval([1, 2, 3]).shape == (1, 512)
    logged = {m.group(1): float(m.group(2)) for line in llama_log.recent_log() if (m := _LOGGED.search(line))}
    needs = model_needs(read_model_info(path), n_ctx)
    assert needs.kv / MIB == pytest.approx(logged["RS"], abs=0.006)  # 1.05 MiB
    assert logged["compute"] <= needs.compute / MIB <= logged["compute"] * 1.10  # never under, at most 10 % over


@pytest.mark.parametrize(
    "arch, keys, windowed",
    [
        ("gemma3", {"attention.sliding_window": 1024}, [i % 6 != 5 for i in range(12)]),  # llama.cpp's default: 6
        (
            "gemma3",
            {"attention.sliding_window": 1024, "attention.sliding_window_pattern": 3},
            [i % 3 != 2 for i in range(12)],
        ),
        (
            "gpt-oss",
            {"attention.sliding_window": 128, "attention.sliding_window_pattern": [True, True, False] * 4},
            [True, True, False] * 4,
        ),  # one flag per layer, as Ollama's converter writes them (llama.cpp's default: 2)
        ("gemma2", {}, [i % 2 == 0 for i in range(12)]),  # a 4,096-token window without the key
        ("gemma3", {}, [False] * 12),  # no window: every layer global
        ("llama4", {"attention.sliding_window": 8192}, [False] * 12),  # chunks: a full cache (not cut back safely)
    ],
)
def test_a_targets_window_layers_cache_the_window_and_a_batch(tmp_path, arch, keys, windowed):
    info = read_model_info(
        _header(
            tmp_path / "m.gguf",
            arch,
            {
                "embedding_length": 1024,
                "block_count": 12,
                "attention.head_count": 8,
                "attention.head_count_kv": 4,
                "attention.key_length": 128,
                "attention.value_length": 128,
                "feed_forward_length": 4096,
            }
            | keys,
        )
    )
    window = keys.get("attention.sliding_window", 4096 if arch == "gemma2" else 0)
    per_cell = 4 * 256 * 2  # KV heads x (K + V) x f16
    cells = [min(32768, -(-(window + 512) // 256) * 256) if w else 32768 for w in windowed]
    assert kv_cache_bytes(info, 32768, window_cache=True) == sum(cells) * per_cell
    assert kv_cache_bytes(info, 32768) == 12 * 32768 * per_cell  # a draft: every position
