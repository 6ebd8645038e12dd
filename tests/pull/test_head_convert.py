"""EAGLE-3 head checkpoints (both published layouts, safetensors and torch zips) converted to GGUF without torch."""

from __future__ import annotations

import pickle
import zipfile

import numpy as np
import pytest
from gguf import GGUFReader

from ollama_spec.errors import ModelLoadError, PullError
from ollama_spec.llama.probe import probe_model
from ollama_spec.models.compat import check_compatibility
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.models.heads import head_facts
from ollama_spec.models.resolve import resolve_model
from ollama_spec.pull.head_checkpoint import iter_tensors, read_head_config, weight_files
from ollama_spec.pull.head_convert import convert_head, permute
from ollama_spec.pull.torch_pickle import read_torch_checkpoint
from ollama_spec.synthetic import PAIRS
from ollama_spec.synthetic.eagle3_checkpoint import head_for, head_tensors, write_head_checkpoint

HEAD_TENSORS = {
    "fc.weight",
    "output_norm.weight",
    "output.weight",
    "d2t",
    *(
        f"blk.0.{n}.weight"
        for n in (
            "attn_norm",
            "attn_norm_2",
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_output",
            "ffn_norm",
            "ffn_gate",
            "ffn_up",
            "ffn_down",
        )
    ),
}


@pytest.fixture(scope="module")
def target(tiny_store):
    return resolve_model("tiny-target", str(tiny_store))


def convert(folder, target, out):
    config = read_head_config(folder / "config.json", str(folder))
    convert_head(config, list(iter_tensors(weight_files(folder), str(folder))), target.info, target.name, out)
    return out


def tensors_of(path):
    return {t.name: t for t in GGUFReader(path).tensors}


@pytest.mark.parametrize("weights", ["safetensors", "bin"])
@pytest.mark.parametrize("layout", ["eagle", "speculators"])
def test_both_layouts_convert_to_a_head_llama_cpp_loads(tmp_path, target, layout, weights):
    head = head_for(PAIRS["tiny"], draft_vocab=200, dtype="BF16" if weights == "bin" else "F16", seed=3)
    folder = write_head_checkpoint(tmp_path / "ckpt", head, layout, weights=weights)
    out = convert(folder, target, tmp_path / "head.gguf")

    info = read_model_info(out)
    assert info.architecture == "eagle3" and info.block_count == 1
    assert set(tensors_of(out)) == HEAD_TENSORS  # t2d dropped; no extra tensor, which would fail the load
    facts = head_facts(info)
    assert facts.target_layers == (2, 2, 1)  # llama.cpp's default [2, N/2, N-3] for the 4-layer target
    assert facts.target_hidden_size == 64 and facts.draft_vocab_size == 200 and facts.has_d2t
    assert check_compatibility(target.info, info).ok
    assert info.tokens == target.info.tokens and info.vocab_type == target.info.vocab_type
    probe = probe_model(out)
    assert (probe.architecture, probe.n_layer, probe.n_embd, probe.n_vocab) == ("eagle3", 1, 64, 512)


def test_q_and_k_rows_permuted_and_d2t_made_absolute(tmp_path, target):
    head = head_for(PAIRS["tiny"], draft_vocab=100, dtype="F32", target_layers=(1, 2, 3))
    folder = write_head_checkpoint(tmp_path / "ckpt", head)
    out = convert(folder, target, tmp_path / "head.gguf")
    source = head_tensors(head)
    written = tensors_of(out)

    def array(name):
        t = written[name]
        return np.asarray(t.data).reshape(tuple(reversed(t.shape.tolist())))

    q = source["midlayer.self_attn.q_proj.weight"]
    np.testing.assert_array_equal(array("blk.0.attn_q.weight"), permute(q, 4))
    np.testing.assert_array_equal(array("blk.0.attn_k.weight"), permute(source["midlayer.self_attn.k_proj.weight"], 2))
    np.testing.assert_array_equal(array("blk.0.attn_v.weight"), source["midlayer.self_attn.v_proj.weight"])
    assert not np.array_equal(array("blk.0.attn_q.weight"), q)
    d2t = array("d2t")
    assert d2t.dtype == np.int64
    np.testing.assert_array_equal(d2t, np.flatnonzero(source["t2d"]))  # offsets + arange: the ids themselves
    assert head_facts(read_model_info(out)).target_layers == (1, 2, 3)  # eagle_aux_hidden_state_layer_ids


def test_permute_pairs_the_two_halves_of_each_head_as_llama_cpp_does():
    rows = np.arange(8).reshape(8, 1)  # 2 heads of 4 rows: Hugging Face pairs (0, 2), (1, 3) in each
    assert permute(rows, 2).ravel().tolist() == [0, 2, 1, 3, 4, 6, 5, 7]


def test_a_checkpoint_that_is_not_a_head_is_refused(tmp_path, target):
    folder = write_head_checkpoint(tmp_path / "ckpt", head_for(PAIRS["tiny"]), config={"num_hidden_layers": 2})
    with pytest.raises(PullError, match="is not an EAGLE-3 head: .* has 2 hidden layers"):
        read_head_config(folder / "config.json", "ckpt")
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 1}')
    with pytest.raises(PullError, match="no draft_vocab_size"):
        read_head_config(plain / "config.json", "plain")


def test_a_head_with_two_target_layers_is_refused(tmp_path, target):
    folder = write_head_checkpoint(tmp_path / "ckpt", head_for(PAIRS["tiny"], target_layers=(1, 2)))
    with pytest.raises(PullError, match=r"names 2 target layers \[1, 2\]; an EAGLE-3 head reads exactly 3"):
        convert(folder, target, tmp_path / "head.gguf")


def test_a_head_made_for_another_width_is_refused(tmp_path, target):
    folder = write_head_checkpoint(tmp_path / "ckpt", head_for(PAIRS["tiny"], target_width=128))
    with pytest.raises(PullError, match=r"fc.weight is \[64, 384\]; a head for tiny-target:latest \(64 wide\)"):
        convert(folder, target, tmp_path / "head.gguf")
    named = write_head_checkpoint(tmp_path / "named", head_for(PAIRS["tiny"]), config={"target_hidden_size": 4096})
    with pytest.raises(PullError, match="was made for a target 4096 wide; tiny-target:latest is 64 wide"):
        convert(named, target, tmp_path / "head.gguf")


def test_tensors_a_head_does_not_have_are_refused(tmp_path, target):
    folder = write_head_checkpoint(tmp_path / "ckpt", head_for(PAIRS["tiny"]), layout="speculators")
    from ollama_spec.synthetic.eagle3_checkpoint import write_safetensors

    extra = np.zeros((2, 2), dtype=np.float32)
    write_safetensors(folder / "extra.safetensors", {"layers.1.mlp.up_proj.weight": ("F32", extra)})
    with pytest.raises(PullError, match="tensors an EAGLE-3 head does not have: layers.1.mlp.up_proj.weight"):
        convert(folder, target, tmp_path / "head.gguf")


def test_a_torch_zip_is_read_without_running_its_pickle(tmp_path):
    class Boom:
        def __reduce__(self):
            return (print, ("ran",))

    path = tmp_path / "pytorch_model.bin"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", pickle.dumps({"x": Boom()}, protocol=2))
    with pytest.raises(PullError, match=r"not a plain state dict of tensors: it names __builtin__.print"):
        list(read_torch_checkpoint(path))


def test_a_file_llama_cpp_refuses_raises_a_load_error(tmp_path):
    path = tmp_path / "x.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 60)
    with pytest.raises(ModelLoadError, match="llama.cpp cannot load"):
        probe_model(path)


def test_llama3_rope_scaling_becomes_rope_freqs_llama_cpp_reads(tmp_path, target):
    rope = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    config = {"rope_scaling": rope | {"original_max_position_embeddings": 256}}
    folder = write_head_checkpoint(tmp_path / "ckpt", head_for(PAIRS["tiny"]), config=config)
    out = convert(folder, target, tmp_path / "head.gguf")
    freqs = np.asarray(tensors_of(out)["rope_freqs.weight"].data)
    assert freqs.shape == (8,) and freqs[0] == 1.0 and freqs[-1] == 8.0  # 16-wide heads: 8 frequencies
    assert "d2t" not in tensors_of(out)  # the target's own vocabulary: no map
    assert probe_model(out).n_layer == 1


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
@pytest.mark.parametrize("dtype", ["F16", "BF16"])
def test_a_head_gguf_written_back_as_a_checkpoint_converts_to_itself(tmp_path, target, layout, dtype):
    from ollama_spec.synthetic.eagle3_checkpoint import checkpoint_from_gguf

    head = head_for(PAIRS["tiny"], draft_vocab=150, dtype=dtype, target_layers=(0, 3, 4), seed=9)
    first = convert(write_head_checkpoint(tmp_path / "ckpt", head, "eagle"), target, tmp_path / "first.gguf")
    again = convert(checkpoint_from_gguf(first, tmp_path / "back", layout), target, tmp_path / "again.gguf")
    a, b = tensors_of(first), tensors_of(again)
    assert set(a) == set(b)
    for name in a:
        assert a[name].tensor_type == b[name].tensor_type, name
        np.testing.assert_array_equal(np.asarray(a[name].data), np.asarray(b[name].data), err_msg=name)
    first_facts, again_facts = head_facts(read_model_info(first)), head_facts(read_model_info(again))
    assert first_facts == again_facts and first_facts.target_layers == (0, 3, 4)


def test_the_targets_tokenizer_keys_are_copied_with_their_types(tmp_path, target):
    from ollama_spec.pull.gguf_keys import read_keys

    out = convert(write_head_checkpoint(tmp_path / "ckpt", head_for(PAIRS["tiny"])), target, tmp_path / "head.gguf")

    def tokenizer(path):
        fields = GGUFReader(path).fields
        return {
            name: (field.types, field.contents()) for name, field in fields.items() if name.startswith("tokenizer.")
        }

    expected = tokenizer(target.path)
    assert len(expected) >= 8 and tokenizer(out) == expected  # gguf's own reader sees the same keys and types
    read = {key: (vtype, item, value) for key, vtype, item, value in read_keys(target.path, lambda k: True)}
    assert set(read) == set(GGUFReader(target.path).fields) - {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count"}
    assert read["tokenizer.ggml.tokens"][2] == list(target.info.tokens)


def test_a_truncated_target_header_is_a_pull_error(tmp_path, target):
    from ollama_spec.pull.gguf_keys import read_keys

    cut = tmp_path / "cut.gguf"
    cut.write_bytes(target.path.read_bytes()[:3000])
    with pytest.raises(PullError, match="cannot read the metadata of"):
        read_keys(cut, lambda key: key.startswith("tokenizer."))
