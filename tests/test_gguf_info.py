import builtins
import struct

import pytest

from ollama_spec import gguf_info
from ollama_spec.errors import CorruptGGUF, NotGGUF
from ollama_spec.gguf_info import format_count, read_model_info
from ollama_spec.synthetic.models import Architecture
from ollama_spec.synthetic.shapes import write_shape_only_gguf

LLAMA_70B = Architecture(n_embd=8192, n_layer=80, n_head=64, n_kv_head=8, n_ff=28672, context_length=131072)


def test_reads_the_synthetic_target_header(tiny_store):
    from ollama_spec.store import Store, find_store_root

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
    from ollama_spec.store import Store, find_store_root

    source = Store(find_store_root(tiny_store)).resolve("tiny-target").gguf_path
    path = tmp_path / "cut.gguf"
    path.write_bytes(source.read_bytes()[:5000])
    with pytest.raises(CorruptGGUF, match=f"{path} is truncated inside its GGUF header"):
        read_model_info(path)


def test_truncated_tensor_data_is_reported(tmp_path, tiny_store):
    from ollama_spec.store import Store, find_store_root

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


def test_unsupported_version(tmp_path):
    path = tmp_path / "v1.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 1, 0, 0))
    with pytest.raises(CorruptGGUF, match="GGUF version 1"):
        read_model_info(path)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(CorruptGGUF, match="cannot read"):
        read_model_info(tmp_path / "nope.gguf")


@pytest.mark.parametrize(
    "count, label", [(70_553_706_496, "70.6B"), (1_235_814_400, "1.2B"), (494_032_768, "494.0M"), (999, "999")]
)
def test_format_count(count, label):
    assert format_count(count) == label
