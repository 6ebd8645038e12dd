from dataclasses import replace

from ollama_spec.models.compat import check_compatibility, llama3_metadata_fixes
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.models.store import Store, find_store_root


def infos(tiny_store, *names):
    store = Store(find_store_root(tiny_store))
    return [read_model_info(store.resolve(n).gguf_path) for n in names]


def test_synthetic_pair_is_compatible(tiny_store):
    target, draft = infos(tiny_store, "tiny-target", "tiny-draft")
    assert check_compatibility(target, draft).ok


def test_alien_vocab_is_reported_with_sizes(tiny_store):
    target, alien = infos(tiny_store, "tiny-target", "tiny-alien")
    problems = check_compatibility(target, alien).problems
    assert "vocab sizes 512 vs 1024 differ by more than 128" in problems


def test_token_text_difference_names_the_token(tiny_store):
    target, draft = infos(tiny_store, "tiny-target", "tiny-draft")
    tokens = list(draft.tokens)
    tokens[300] = "Ġbar"
    problems = check_compatibility(target, replace(draft, tokens=tuple(tokens))).problems
    assert problems == (f"token 300 is {target.tokens[300]!r} in target, 'Ġbar' in draft",)


def test_differences_below_token_5_are_ignored(tiny_store):
    target, draft = infos(tiny_store, "tiny-target", "tiny-draft")
    tokens = list(draft.tokens)
    tokens[4] = "x"
    assert check_compatibility(target, replace(draft, tokens=tuple(tokens))).ok


def test_vocab_type_and_bos_differences(tiny_store):
    target, draft = infos(tiny_store, "tiny-target", "tiny-draft")
    problems = check_compatibility(target, replace(draft, vocab_type="llama", bos_id=1)).problems
    assert problems[0] == "vocabulary types differ: 'gpt2' in target, 'llama' in draft"
    assert problems[1].startswith("BOS differs: add_bos True / id 507 in target")


def test_small_vocab_size_difference_is_allowed(tiny_store):
    target, draft = infos(tiny_store, "tiny-target", "tiny-draft")
    assert check_compatibility(target, replace(draft, vocab_size=512 + 128)).ok


def test_llama3_gap_is_detected_and_corrected(tiny_store):
    (target,) = infos(tiny_store, "tiny-target")
    assert llama3_metadata_fixes(target) == ()  # eot_id is set and pre is llama-bpe
    broken = replace(target, pre_tokenizer=None, eot_id=None)
    fixes = llama3_metadata_fixes(broken)
    assert [f.kv_overrides for f in fixes] == [
        (("tokenizer.ggml.pre", "llama-bpe"),),
        (("tokenizer.ggml.eot_token_id", 511),),
    ]
    assert fixes[1].extra_stop_ids == (511,)
    assert "<|eot_id|>" in fixes[1].description


def write_header_only(path, arch, tiny_store):
    """A GGUF with `arch` and the tiny models' vocabulary, and no tensors (never loaded)."""
    import gguf

    (tiny,) = infos(tiny_store, "tiny-target")
    writer = gguf.GGUFWriter(path, arch=arch)
    writer.add_block_count(2)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(list(tiny.tokens))
    writer.add_bos_token_id(tiny.bos_id)
    writer.add_eos_token_id(tiny.eos_id)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    return path


def test_recurrent_and_hybrid_models_cannot_take_part(tiny_store, tmp_path):
    target, draft = infos(tiny_store, "tiny-target", "tiny-draft")
    mamba = read_model_info(write_header_only(tmp_path / "mamba.gguf", "mamba", tiny_store))
    hybrid = read_model_info(write_header_only(tmp_path / "jamba.gguf", "jamba", tiny_store))
    assert check_compatibility(mamba, draft).problems == (
        "the target is a recurrent model (mamba) whose cache cannot drop rejected draft tokens; run it without a draft",
    )
    assert check_compatibility(target, hybrid).problems == (
        "the draft is a hybrid model (jamba) whose cache cannot drop rejected draft tokens; run it without a draft",
    )
