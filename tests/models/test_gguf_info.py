import builtins
import json
import struct

import numpy as np
import pytest

from ollama_spec.errors import CorruptGGUF, NotGGUF
from ollama_spec.models import gguf_info
from ollama_spec.models.gguf_info import format_count, read_model_info
from ollama_spec.synthetic.models import Architecture
from tests.builders.shapes import write_shape_only_gguf

LLAMA_70B = Architecture(n_embd=8192, n_layer=80, n_head=64, n_kv_head=8, n_ff=28672, context_length=131072)


def test_reads_the_synthetic_target_header(tiny_store):
    from ollama_spec.models.store import Store, find_store_root

    info = read_model_info(Store(find_store_root(tiny_store)).resolve("tiny-target").gguf_path)
    assert (info.architecture, info.file_type, info.block_count, info.embedding_length) == ("llama", "F32", 4, 64)
    assert (info.head_count, info.head_count_kv, info.head_dim) == (4, 2, 16)
    assert (info.vocab_type, info.pre_tokenizer, info.vocab_size) == ("gpt2", "llama-bpe", 512)
    assert info.token_text(info.bos_id) == "<|begin_of_text|>"
    assert info.token_text(info.eos_id) == "<|end_of_text|>"
    assert info.token_text(info.eot_id) == "<|eot_id|>"
    assert info.add_bos is True and info.add_eos is False and info.has_chat_template
    # By hand: token_embd and output 512 x 64 each, output_norm 64; per layer q/o 64 x 64, k/v 64 x 32
    # (2 KV heads of 16), gate/up/down 64 x 128, two norms of 64: 36,992; 4 layers.
    assert info.parameter_count == 2 * 512 * 64 + 64 + 4 * (2 * 4096 + 2 * 2048 + 3 * 8192 + 2 * 64) == 213_568
    assert info.tensor_bytes == 213_568 * 4  # F32


def test_header_only_read_of_a_sparse_40_gb_model(sparse_dir, monkeypatch):
    path = sparse_dir / "llama70b.gguf"
    size = write_shape_only_gguf(path, name="llama3.1-70b", arch=LLAMA_70B, vocab_size=128256, n_merges=280147)
    assert size > 35 << 30  # the file claims ~37 GiB of Q4_K_M weights ...
    header_size = path.stat().st_blocks * 512  # ... but only the header occupies disk
    read_bytes = []
    real_open = builtins.open

    class CountingFile:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            data = self.f.read(n)
            read_bytes.append(len(data))
            return data

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(gguf_info, "open", lambda *a, **k: CountingFile(real_open(*a, **k)), raising=False)
    info = read_model_info(path)
    assert info.parameter_label == "70.6B" and info.file_type == "Q4_K_M"
    assert info.vocab_size == 128256 and len(info.tokens) == 128256
    assert info.tensor_bytes > 35 << 30
    assert sum(read_bytes) < 2 * header_size + (4 << 20)  # tensor data is never read


def test_non_gguf_file_is_named(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b'{"__metadata__": {}}' + b"\0" * 100)
    with pytest.raises(NotGGUF, match=f"{path} is not a GGUF file"):
        read_model_info(path)


def test_truncated_header_is_reported(tmp_path, tiny_store):
    from ollama_spec.models.store import Store, find_store_root

    source = Store(find_store_root(tiny_store)).resolve("tiny-target").gguf_path
    path = tmp_path / "cut.gguf"
    path.write_bytes(source.read_bytes()[:5000])
    with pytest.raises(CorruptGGUF, match=f"{path} is truncated inside its GGUF header"):
        read_model_info(path)


def test_truncated_tensor_data_is_reported(tmp_path, tiny_store):
    from ollama_spec.models.store import Store, find_store_root

    source = Store(find_store_root(tiny_store)).resolve("tiny-target").gguf_path
    path = tmp_path / "cut.gguf"
    path.write_bytes(source.read_bytes()[:-1000])
    with pytest.raises(CorruptGGUF, match=f"{path} is truncated: its tensors need"):
        read_model_info(path)


def test_garbage_counts_are_rejected(tmp_path):
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 2**40, 2**40) + b"\0" * 64)
    with pytest.raises(CorruptGGUF, match="impossible tensor or key count"):
        read_model_info(path)


@pytest.mark.parametrize("version", [0, 1, 4, 0xFFFF])
def test_unsupported_version(tmp_path, version):
    path = tmp_path / "v.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", version, 0, 0))
    with pytest.raises(CorruptGGUF, match=f"{path} is GGUF version {version}; only versions 2 and 3 are supported"):
        read_model_info(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CorruptGGUF, match="cannot read"):
        read_model_info(tmp_path / "nope.gguf")


@pytest.mark.parametrize(
    "count, label", [(70_553_706_496, "70.6B"), (1_235_814_400, "1.2B"), (494_032_768, "494.0M"), (999, "999")]
)
def test_format_count(count, label):
    assert format_count(count) == label


def test_per_layer_arrays_are_read_per_layer_and_size_the_kv_cache_as_llama_cpp_does(tmp_path):
    from ollama_spec.llama import log as llama_log
    from ollama_spec.llama import model as runtime
    from ollama_spec.planning.kv_cache import kv_cache_bytes
    from tests.gguf_bytes import write_deci_model

    path = write_deci_model(tmp_path / "deci.gguf", kv_heads=(4, 0, 1, 2), ffs=(128, 256, 0, 64))
    info = read_model_info(path)
    assert info.head_count_kv_layers == (4, 0, 1, 2) and info.feed_forward_layers == (128, 256, 0, 64)
    assert (info.block_count, info.head_count_kv, info.feed_forward_length, info.head_dim) == (4, 4, 256, 16)
    assert info.summary()["head_count_kv_per_layer"] == [4, 0, 1, 2]
    assert info.summary()["head_count_per_layer"] == [4, 0, 4, 4]
    # 7 KV heads over all layers x 16 x (K + V) x f16, not 4 layers x 4 heads
    assert kv_cache_bytes(info, 1024) == 1024 * 7 * 16 * 2 * 2
    llama_log.clear_log()
    with runtime.LoadedModel(path, runtime.LoadSettings(n_ctx=1024, n_threads=1)) as model:
        assert model.eval([1, 2, 3]).shape == (1, 300)
    logged = [line for line in llama_log.recent_log() if "KV buffer size" in line]
    assert logged and f"{kv_cache_bytes(info, 1024) / (1 << 20):.2f} MiB" in logged[0]


def test_scalar_head_counts_apply_to_every_layer(tiny_models):
    info = tiny_models[0].info
    assert info.head_count_kv_layers == (2,) * 4 and info.head_count_layers == (4,) * 4
    assert info.kv_head_total == 8 and info.summary()["head_count_kv_per_layer"] is None


def test_per_layer_array_of_the_wrong_length_is_no_value(tmp_path):
    from tests.gguf_bytes import write_model

    path = write_model(
        tmp_path / "m.gguf",
        {"llama.block_count": 3, "llama.attention.head_count": [4, 4], "llama.feed_forward_length": [8, 8, 8]},
    )
    info = read_model_info(path)  # llama.cpp refuses "wrong array length"; so does the memory plan
    assert info.head_count_layers is None and info.head_count is None and info.head_count_kv is None
    assert info.feed_forward_layers == (8, 8, 8)


@pytest.mark.parametrize(
    "key, value",
    [
        ("general.architecture", 7),
        ("general.name", 1.5),
        ("general.file_type", float("inf")),
        ("llama.block_count", float("nan")),
        ("llama.block_count", -1),
        ("llama.block_count", 10**6),
        ("llama.embedding_length", "wide"),
        ("llama.attention.head_count", [-4, 4]),
        ("tokenizer.ggml.model", 3),
        ("tokenizer.ggml.add_bos_token", "yes"),
        ("tokenizer.ggml.bos_token_id", 10**9),
        ("tokenizer.chat_template", [1, 2]),
        ("general.alignment", 64),
    ],
)
def test_metadata_of_the_wrong_type_or_range_reads_as_absent(tmp_path, key, value):
    from gguf import GGUFValueType, GGUFWriter

    path = tmp_path / "m.gguf"
    writer = GGUFWriter(path, arch="llama") if key != "general.architecture" else GGUFWriter(path, arch="x")
    if key == "general.architecture":
        writer.kv_data[0].pop(key)
    vtype = {
        int: GGUFValueType.INT64,
        float: GGUFValueType.FLOAT64,
        str: GGUFValueType.STRING,
        list: GGUFValueType.ARRAY,
    }[type(value)]
    writer.add_key_value(key, value, vtype, sub_type=GGUFValueType.INT32 if vtype == GGUFValueType.ARRAY else None)
    writer.add_block_count(2) if key != "llama.block_count" else None
    writer.add_token_list(["a", "b"])
    writer.add_tensor("t", np.zeros(8, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    info = read_model_info(path)
    facts = info.summary()
    json.dumps(facts)  # everything shown is plain data
    assert info.architecture == ("unknown" if key == "general.architecture" else "llama") and info.name is None
    assert facts["block_count"] in (2, None) and facts["embedding_length"] is None
    assert isinstance(info.add_bos, bool) and info.bos_id in (None, 11) and info.chat_template is None
