"""An EAGLE-3 head checkpoint converted to the GGUF llama.cpp loads (src/models/eagle3.cpp), without torch.

What llama.cpp's own converter (conversion/llama.py) does for these heads, over numpy arrays: the decoder
layer (`midlayer.*` or `layers.0.*`) becomes block 0 with Llama's tensor names, `hidden_norm` becomes
`attn_norm_2`, `input_norm` becomes `enc.output_norm` (read only with `norm_before_fc`), `fc` is kept, q and k
are permuted as for any Llama (llama.cpp's RoPE pairs neighbouring dimensions, Hugging Face's pairs the two
halves), `d2t` offsets become absolute I64 target ids (`d2t + arange`), `t2d` is dropped. `target_layers`
comes from the config, else llama.cpp's default for the target; the tokenizer is copied from the target's own
GGUF, so the head's vocabulary is the target's exactly.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType

from ollama_spec.errors import PullError
from ollama_spec.models.gguf_info import ModelInfo
from ollama_spec.models.heads import EAGLE3_ARCH, HEAD_TARGET_LAYERS
from ollama_spec.pull.gguf_keys import read_keys
from ollama_spec.pull.head_checkpoint import HeadConfig, SourceTensor

LAYER_PREFIXES = ("midlayer.", "layers.0.", "model.layers.0.")
LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "hidden_norm.weight": "attn_norm_2.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
TOP_NAMES = {
    "fc.weight": "fc.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "embed_tokens.weight": "token_embd.weight",
    "input_norm.weight": "enc.output_norm.weight",
    "d2t": "d2t",
}
DROPPED = ("t2d", "rotary_emb.inv_freq")  # t2d: the target-to-draft mask, unused at run time
FILE_TYPES = {"F16": LlamaFileType.MOSTLY_F16, "BF16": LlamaFileType.MOSTLY_BF16, "F32": LlamaFileType.ALL_F32}
NUMPY_TYPES = {"F16": np.float16, "F32": np.float32, "I64": np.int64, "BF16": np.uint16}


@dataclass(frozen=True)
class _Planned:
    name: str  # the GGUF name
    shape: tuple[int, ...]  # numpy order
    kind: str  # F32, F16, BF16, I64: what is written
    convert: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(NUMPY_TYPES[self.kind]).itemsize


def convert_head(
    config: HeadConfig,
    tensors: list[SourceTensor],
    target: ModelInfo,
    target_name: str,
    out_path: Path,
    progress: Callable[[int, int], None] = lambda done, total: None,
) -> None:
    """Write `out_path`: the head of `config`/`tensors` as an EAGLE-3 GGUF for `target` (named `target_name` in
    messages); `progress(bytes written, bytes in all)`. PullError, saying why, when it is no head for `target`."""
    shape = _HeadShape.of(config)
    layers = _target_layers(config, target, target_name)
    planned = _plan(config, tensors, shape.n_head, shape.n_kv, target.vocab_size)
    fc = next((p for p in planned if p.name == "fc.weight"), None)
    width = target.embedding_length
    if fc is None or fc.shape != (shape.n_embd, HEAD_TARGET_LAYERS * width):
        raise PullError(
            f"{config.source}: fc.weight is {list(fc.shape) if fc else 'missing'}; a head for {target_name} "
            f"({width} wide) needs [{shape.n_embd}, {HEAD_TARGET_LAYERS * width}]"
        )
    rope_freqs = _llama3_rope_freqs(config.hparams, shape.head_dim)
    if rope_freqs is not None:
        planned.append(_Planned("rope_freqs.weight", rope_freqs.shape, "F32", lambda: rope_freqs))
    kind = max((p.kind for p in planned if len(p.shape) == 2), key=["F32", "BF16", "F16"].index, default="F32")
    writer = GGUFWriter(out_path, arch=EAGLE3_ARCH)
    try:
        writer.add_name(f"EAGLE-3 head for {target_name}")
        _write_keys(writer, config, shape, target, layers, FILE_TYPES[kind])
        copy_tokenizer(target.path, writer)
        _write_tensors(writer, planned, progress)
    finally:
        writer.close()


@dataclass(frozen=True)
class _HeadShape:
    n_embd: int
    n_head: int
    n_kv: int
    head_dim: int

    @classmethod
    def of(cls, config: HeadConfig) -> _HeadShape:
        n_embd, n_head = config.count("hidden_size"), config.count("num_attention_heads")
        n_kv = config.count("num_key_value_heads", n_head)
        return cls(n_embd, n_head, n_kv, config.count("head_dim", n_embd // n_head))


def _target_layers(config: HeadConfig, target: ModelInfo, target_name: str) -> list[int]:
    """The 3 target layers the head reads; PullError where `target` cannot be its target."""
    width = target.embedding_length
    if target.block_count is None or width is None:
        raise PullError(f"{target_name} has no layer count or width in its header: it cannot be a head's target")
    if config.hparams.get("target_hidden_size") not in (None, width):
        raise PullError(
            f"{config.source} was made for a target {config.hparams['target_hidden_size']} wide; "
            f"{target_name} is {width} wide"
        )
    layers = config.target_layers(target.block_count)
    if len(layers) != HEAD_TARGET_LAYERS:
        raise PullError(f"{config.source} names {len(layers)} target layers {layers}; an EAGLE-3 head reads exactly 3")
    if not all(0 <= layer <= target.block_count for layer in layers):
        raise PullError(
            f"{config.source} reads target layers {layers} but {target_name} has {target.block_count} layers: "
            "it is no head for this target"
        )
    return layers


def _write_keys(
    writer: GGUFWriter,
    config: HeadConfig,
    shape: _HeadShape,
    target: ModelInfo,
    layers: list[int],
    file_type: LlamaFileType,
) -> None:
    """The head's hyper-parameters, as llama.cpp's eagle3 architecture reads them."""
    hp = config.hparams
    if target.name:  # the model it was made for, by its own general.name: what `auto` matches heads by
        writer.add_base_model_count(1)
        writer.add_base_model_name(0, target.name)
    writer.add_file_type(file_type)
    writer.add_context_length(config.count("max_position_embeddings", target.context_length or 2048))
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(1)
    writer.add_feed_forward_length(config.count("intermediate_size"))
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_kv)
    if shape.head_dim != shape.n_embd // shape.n_head:
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
    writer.add_layer_norm_rms_eps(float(hp.get("rms_norm_eps", 1e-5)))
    writer.add_rope_freq_base(float(hp.get("rope_theta", 10000.0)))
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_vocab_size(target.vocab_size)
    writer.add_array(f"{EAGLE3_ARCH}.target_layers", layers)
    writer.add_uint32(f"{EAGLE3_ARCH}.target_hidden_size", target.embedding_length)
    writer.add_bool(f"{EAGLE3_ARCH}.norm_before_residual", bool(hp.get("norm_before_residual", False)))
    writer.add_bool(f"{EAGLE3_ARCH}.norm_before_fc", bool(hp.get("norm_before_fc", False)))


def _write_tensors(writer: GGUFWriter, planned: list[_Planned], progress: Callable[[int, int], None]) -> None:
    """The header, the keys and the tensors' data, converted one at a time."""
    for p in planned:
        raw = GGMLQuantizationType.BF16 if p.kind == "BF16" else None
        writer.add_tensor_info(p.name, p.shape, np.dtype(NUMPY_TYPES[p.kind]), p.nbytes, raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    total, done = sum(p.nbytes for p in planned), 0
    for p in planned:
        writer.write_tensor_data(p.convert())
        done += p.nbytes
        progress(done, total)


def copy_tokenizer(target_path: Path, writer: GGUFWriter) -> None:
    """Every `tokenizer.*` key of the target's GGUF, with its GGUF types, into `writer`."""
    for key, vtype, item_type, value in read_keys(target_path, lambda key: key.startswith("tokenizer.")):
        writer.add_key_value(key, value, vtype, item_type)


def _plan(config: HeadConfig, tensors: list[SourceTensor], n_head: int, n_kv: int, n_vocab: int) -> list[_Planned]:
    planned, unknown = [], []
    norm_before_fc = bool(config.hparams.get("norm_before_fc", False))
    for t in tensors:
        name = _gguf_name(t.name)
        if name is None:
            if not t.name.endswith(DROPPED):
                unknown.append(t.name)
            continue
        if name == "enc.output_norm.weight" and not norm_before_fc:
            continue  # llama.cpp reads it only with norm_before_fc, and refuses a file with a tensor it does not read
        if name == "d2t":
            planned.append(_Planned(name, t.shape, "I64", _d2t(config, t, n_vocab)))
            continue
        if t.dtype not in ("F16", "BF16", "F32", "F64"):
            raise PullError(f"{config.source}: tensor {t.name} has type {t.dtype}; a weight must be a float")
        permute = n_head if name == "blk.0.attn_q.weight" else n_kv if name == "blk.0.attn_k.weight" else None
        kind = "F32" if len(t.shape) == 1 or t.dtype == "F64" else t.dtype
        planned.append(_Planned(name, t.shape, kind, _weights(t, kind, permute)))
    if unknown:
        raise PullError(
            f"{config.source} has tensors an EAGLE-3 head does not have: {', '.join(unknown[:5])}"
            + (" ..." if len(unknown) > 5 else "")
        )
    return planned


def _gguf_name(name: str) -> str | None:
    for prefix in LAYER_PREFIXES:
        if name.startswith(prefix) and name[len(prefix) :] in LAYER_NAMES:
            return "blk.0." + LAYER_NAMES[name[len(prefix) :]]
    return TOP_NAMES.get(name.removeprefix("model."))


def _weights(t: SourceTensor, kind: str, permute_heads: int | None) -> Callable[[], np.ndarray]:
    def convert() -> np.ndarray:
        data = t.load()
        if kind == "F32":
            data = _bf16_to_f32(data) if t.dtype == "BF16" else data.astype(np.float32)
        if permute_heads is not None:
            data = permute(data, permute_heads)
        return np.ascontiguousarray(data)

    return convert


def permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order for RoPE (conversion/llama.py `LlamaModel.permute`), for `n_head` heads."""
    rows = weights.shape[0]
    return weights.reshape(n_head, 2, rows // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def _d2t(config: HeadConfig, t: SourceTensor, n_vocab: int) -> Callable[[], np.ndarray]:
    def convert() -> np.ndarray:
        offsets = t.load().astype(np.int64).reshape(-1)
        ids = offsets + np.arange(offsets.size, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= n_vocab):
            raise PullError(f"{config.source}: d2t maps to token {int(ids.max())}, past the target's {n_vocab} tokens")
        if np.unique(ids).size != ids.size:
            raise PullError(f"{config.source}: d2t maps two draft tokens to one target token")
        return ids

    return convert


def _bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _llama3_rope_freqs(hp: dict, head_dim: int) -> np.ndarray | None:
    """Llama 3's RoPE scaling factors (rope_type llama3), as llama.cpp's converter writes them."""
    rope = hp.get("rope_scaling") or hp.get("rope_parameters") or {}
    if not isinstance(rope, dict) or str(rope.get("rope_type", rope.get("type", ""))).lower() != "llama3":
        return None
    base = float(rope.get("rope_theta", hp.get("rope_theta", 10000.0)))
    freqs = 1.0 / (base ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    factor = float(rope.get("factor", 8.0))
    low, high = float(rope.get("low_freq_factor", 1.0)), float(rope.get("high_freq_factor", 4.0))
    old_context = float(rope.get("original_max_position_embeddings", 8192))
    low_wavelen, high_wavelen = old_context / low, old_context / high
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            factors.append(1.0)
        elif wavelen > low_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(factors, dtype=np.float32)
