"""Header-only GGUFs with the shapes of real models (e.g. Llama 3.1 70B), sparse to full size.

The header is real: metadata, tokenizer, one tensor info per weight with its true type and
size. The data section is a hole (`truncate` to the full size), so a "40 GB" model costs a few
megabytes of disk and can be inspected, planned for and listed, but not run.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, LlamaFileType

from ollama_spec.synthetic.models import LLAMA3_CHAT_TEMPLATE, Architecture, new_llama_writer
from ollama_spec.synthetic.tokenizer import SPECIAL_TOKENS

QUANT_FILE_TYPES = {
    GGMLQuantizationType.Q4_K: LlamaFileType.MOSTLY_Q4_K_M,
    GGMLQuantizationType.Q8_0: LlamaFileType.MOSTLY_Q8_0,
    GGMLQuantizationType.F16: LlamaFileType.MOSTLY_F16,
}


def write_shape_only_gguf(
    path: Path,
    *,
    name: str,
    arch: Architecture,
    vocab_size: int,
    weight_type: GGMLQuantizationType = GGMLQuantizationType.Q4_K,
    tied_embeddings: bool = False,
    n_merges: int = 0,
) -> int:
    """Write the header for a llama model of these shapes and extend the file sparsely; return its size."""
    writer = new_llama_writer(path, name, arch, arch.n_layer, QUANT_FILE_TYPES[weight_type])
    writer.add_vocab_size(vocab_size)
    tokens = [f"tok{i}" for i in range(vocab_size - len(SPECIAL_TOKENS))] + list(SPECIAL_TOKENS)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("llama-bpe")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab_size - len(SPECIAL_TOKENS)) + [3] * len(SPECIAL_TOKENS))
    writer.add_token_merges([f"tok{i % 1000} tok{(i * 7) % 1000}" for i in range(n_merges)])
    writer.add_bos_token_id(vocab_size - 5)
    writer.add_eos_token_id(vocab_size - 4)
    writer.add_eot_token_id(vocab_size - 1)
    writer.add_add_bos_token(True)
    writer.add_chat_template(LLAMA3_CHAT_TEMPLATE)

    d, kv, ff = arch.n_embd, arch.n_kv_head * arch.head_dim, arch.n_ff
    shapes = {"token_embd.weight": ((vocab_size, d), weight_type), "output_norm.weight": ((d,), None)}
    if not tied_embeddings:
        shapes["output.weight"] = (
            (vocab_size, d),
            GGMLQuantizationType.Q6_K if weight_type == GGMLQuantizationType.Q4_K else weight_type,
        )
    for i in range(arch.n_layer):
        p = f"blk.{i}."
        shapes |= {
            p + "attn_norm.weight": ((d,), None),
            p + "ffn_norm.weight": ((d,), None),
            p + "attn_q.weight": ((d, d), weight_type),
            p + "attn_k.weight": ((kv, d), weight_type),
            p + "attn_v.weight": ((kv, d), weight_type),
            p + "attn_output.weight": ((d, d), weight_type),
            p + "ffn_gate.weight": ((ff, d), weight_type),
            p + "ffn_up.weight": ((ff, d), weight_type),
            p + "ffn_down.weight": ((d, ff), weight_type),
        }
    data_bytes = 0
    for tensor_name, (shape, qtype) in shapes.items():
        qtype = qtype or GGMLQuantizationType.F32
        block, type_size = GGML_QUANT_SIZES[qtype]
        n_bytes = int(np.prod(shape)) * type_size // block
        writer.add_tensor_info(tensor_name, shape, np.dtype(np.float32), n_bytes, raw_dtype=qtype)
        data_bytes += _aligned(n_bytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    size = _aligned(path.stat().st_size) + data_bytes
    with open(path, "r+b") as f:
        f.truncate(size)  # a hole: no disk blocks behind the "weights"
    return size


def _aligned(n: int, alignment: int = 32) -> int:
    return -(-n // alignment) * alignment
