"""Deterministic llama-architecture GGUF files: a target and a draft that agree with it.

The draft is the target's embeddings, output matrix and first layer(s). The target's other
layers add small residual updates (`residual_scale`), so the draft predicts the target's next
token most of the time; a larger scale lowers agreement. The output matrix is scaled so that
logits spread by several units (`logit_std`): greedy choices then do not flip between batch
sizes, and temperature-1 sampling still has a real distribution to sample from.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, Keys, LlamaFileType, quants

from ollama_spec.synthetic.tokenizer import BOS, EOS, EOT, Vocabulary

LLAMA3_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"
)
FILE_TYPES = {
    "F32": LlamaFileType.ALL_F32,
    "F16": LlamaFileType.MOSTLY_F16,
    "Q8_0": LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": LlamaFileType.MOSTLY_Q4_0,
}
# Quantized files: every matrix through the gguf package's own quantizer; norms stay F32.
QUANTIZED = {"Q8_0": GGMLQuantizationType.Q8_0, "Q4_0": GGMLQuantizationType.Q4_0}


@dataclass(frozen=True)
class Architecture:
    n_embd: int
    n_layer: int
    n_head: int
    n_kv_head: int
    n_ff: int
    context_length: int = 8192
    rope_theta: float = 500000.0
    rms_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


@dataclass(frozen=True)
class WeightRecipe:
    seed: int
    dtype: str = "F32"  # "F32" or "F16" (F16 makes a CPU target memory-bound, like a GPU); see write_gguf
    residual_scale: float = 0.1  # size of the target-only layers' updates
    logit_std: float = 4.0
    # (after_token, eot_token): the model tends to end its turn right after `after_token`,
    # so tests and demos see natural end-of-turn tokens.
    eot_after: tuple[int, int] | None = None
    quiet_tokens: tuple[int, ...] = ()  # rows damped so raw bytes rarely win


def _output_matrix(embeddings: np.ndarray, raw: np.ndarray, recipe: WeightRecipe) -> np.ndarray:
    out = raw.astype(np.float32)
    if recipe.quiet_tokens:
        out[list(recipe.quiet_tokens)] *= 0.3
    if recipe.eot_after:
        after, eot = recipe.eot_after
        direction = embeddings[after].astype(np.float32)
        out[eot] = direction * (recipe.logit_std / np.linalg.norm(direction))
    return out.astype(raw.dtype)


def make_weights(
    arch: Architecture,
    vocab_size: int,
    recipe: WeightRecipe,
    draft_layers: int,
    layer_done: Callable[[int, int], None] = lambda done, total: None,
) -> dict[str, np.ndarray]:
    """All target tensors (numpy shapes are [out, in]); the draft takes a subset by name.
    `layer_done(done, total)` after each layer (the demo target's take a second each)."""
    dtype = np.float16 if recipe.dtype == "F16" else np.float32
    d, kv = arch.n_embd, arch.n_kv_head * arch.head_dim

    def normal(name: str, shape: tuple[int, int], std: float) -> np.ndarray:
        rng = np.random.default_rng([recipe.seed, zlib.crc32(name.encode())])
        return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(dtype)

    ones = np.ones(d, dtype=np.float32)  # norm weights stay F32, as llama.cpp expects
    embeddings = normal("token_embd", (vocab_size, d), 1.0)
    output = normal("output", (vocab_size, d), recipe.logit_std / np.sqrt(d))
    tensors = {
        "token_embd.weight": embeddings,
        "output_norm.weight": ones,
        "output.weight": _output_matrix(embeddings, output, recipe),
    }
    for i in range(arch.n_layer):
        # Layers the draft shares write to the residual stream at full strength; the rest nudge it.
        out_scale = 1.0 if i < draft_layers else recipe.residual_scale
        p = f"blk.{i}."
        tensors |= {
            p + "attn_norm.weight": ones,
            p + "attn_q.weight": normal(p + "q", (d, d), 1 / np.sqrt(d)),
            p + "attn_k.weight": normal(p + "k", (kv, d), 1 / np.sqrt(d)),
            p + "attn_v.weight": normal(p + "v", (kv, d), 1 / np.sqrt(d)),
            p + "attn_output.weight": normal(p + "o", (d, d), out_scale / np.sqrt(d)),
            p + "ffn_norm.weight": ones,
            p + "ffn_gate.weight": normal(p + "gate", (arch.n_ff, d), 1 / np.sqrt(d)),
            p + "ffn_up.weight": normal(p + "up", (arch.n_ff, d), 1 / np.sqrt(d)),
            p + "ffn_down.weight": normal(p + "down", (d, arch.n_ff), out_scale / np.sqrt(arch.n_ff)),
        }
        layer_done(i + 1, arch.n_layer)
    return tensors


def new_llama_writer(
    path: Path, name: str, arch: Architecture, n_layer: int, file_type: int, architecture: str = "llama"
) -> GGUFWriter:
    """A GGUFWriter with the llama hyper-parameters written (under another `architecture`'s keys
    for a llama-like one: Gemma); tokenizer and tensors are the caller's."""
    writer = GGUFWriter(path, arch=architecture)
    writer.add_name(name)
    writer.add_file_type(file_type)
    writer.add_context_length(arch.context_length)
    writer.add_embedding_length(arch.n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(arch.n_ff)
    writer.add_head_count(arch.n_head)
    writer.add_head_count_kv(arch.n_kv_head)
    writer.add_rope_dimension_count(arch.head_dim)
    writer.add_rope_freq_base(arch.rope_theta)
    writer.add_layer_norm_rms_eps(arch.rms_eps)
    return writer


def add_vocabulary(writer: GGUFWriter, vocab: Vocabulary, *, llama3_metadata_gap: bool = False) -> None:
    """The byte-level BPE vocabulary and its special token ids (see write_gguf for the gap)."""
    writer.add_vocab_size(vocab.size)
    writer.add_tokenizer_model("gpt2")
    if not llama3_metadata_gap:
        writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_types(list(vocab.token_types))
    writer.add_token_merges(list(vocab.merges))
    writer.add_bos_token_id(vocab.id_of(BOS))
    writer.add_eos_token_id(vocab.id_of(EOS))
    if not llama3_metadata_gap:
        writer.add_eot_token_id(vocab.id_of(EOT))


def write_gguf(
    path: Path,
    *,
    name: str,
    arch: Architecture,
    n_layer: int,
    vocab: Vocabulary,
    weights: dict[str, np.ndarray],
    dtype: str,
    chat_template: str | None = LLAMA3_CHAT_TEMPLATE,
    llama3_metadata_gap: bool = False,
    fim_ids: tuple[int, int, int] | None = None,
    layer_done: Callable[[int, int], None] = lambda done, total: None,
) -> None:
    """Write a llama GGUF using the first `n_layer` blocks of `weights`, stored as `dtype` (FILE_TYPES);
    `layer_done(done, n_layer)` as each block is on disk.

    `llama3_metadata_gap` reproduces some published Llama 3 GGUFs: no `tokenizer.ggml.pre`, no
    EOT id, and EOS pointing at `<|end_of_text|>`.
    """
    writer = new_llama_writer(path, name, arch, n_layer, FILE_TYPES[dtype])
    add_vocabulary(writer, vocab, llama3_metadata_gap=llama3_metadata_gap)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    if chat_template:
        writer.add_chat_template(chat_template)
    if fim_ids is not None:  # a code model's fill-in-the-middle markers: prefix, suffix, middle
        for key, token in zip(
            (Keys.Tokenizer.FIM_PRE_ID, Keys.Tokenizer.FIM_SUF_ID, Keys.Tokenizer.FIM_MID_ID), fim_ids
        ):
            writer.add_uint32(key, token)
    kept = {name: a for name, a in weights.items() if not name.startswith("blk.") or _block(name) < n_layer}
    last_of_block = {_block(name): name for name in kept if name.startswith("blk.")}
    for tensor_name, array in kept.items():
        raw_dtype = None
        if dtype in QUANTIZED and array.ndim == 2:
            raw_dtype = QUANTIZED[dtype]
            array = quants.quantize(array.astype(np.float32), raw_dtype)
        if tensor_name.startswith("blk.") and last_of_block[block := _block(tensor_name)] == tensor_name:
            array = _Announced.of(array, lambda done=block + 1: layer_done(done, n_layer))
        writer.add_tensor(tensor_name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _block(tensor_name: str) -> int:
    return int(tensor_name.split(".")[1])  # "blk.3.attn_q.weight" -> 3


class _Announced(np.ndarray):
    """An array that calls `written()` once GGUFWriter has written it: the writer writes every tensor with
    `tofile`, and has no hook of its own but a tqdm bar."""

    written: Callable[[], None]

    @classmethod
    def of(cls, array: np.ndarray, written: Callable[[], None]) -> _Announced:
        view = array.view(cls)  # the same memory, no copy
        view.written = written
        return view

    def tofile(self, *args, **kwargs) -> None:
        super().tofile(*args, **kwargs)
        self.written()
