"""A synthetic target with one MTP (NextN) layer, in an architecture llama.cpp drafts from.

llama.cpp builds an MTP draft graph (`LLM_GRAPH_TYPE_DECODER_MTP`) only for architectures that
ship NextN layers: all are mixture-of-experts, hybrid (recurrent) or sparse-attention models, none a
dense Llama. `glm4moe` is the one among them with plain attention and a KV cache that can be cut
back, so it is written here: dense trunk layers (`leading_dense_block_count` = the trunk) and the
NextN block after them as GLM-4.5 lays it out (a mixture-of-experts layer with `nextn.eh_proj`,
`enorm`, `hnorm`, `shared_head_norm`). Random weights: it loads, decodes and drafts; its drafts
agree with the target by chance only. The tokenizer is copied from another GGUF (a synthetic
target's), so prompts tokenize as they do there.

`crafted`: drafts that mostly agree. The trunk's layers add little to the residual stream (their output
matrices scaled down), so the target's next token after t is nearly output(norm(embd(t))); the NextN
layer passes the token's embedding through (`eh_proj` = [I, 0]) and adds nothing of its own, so after
reading t[P+1] it predicts what the target predicts there: t[P+2].
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFWriter

from ollama_spec.synthetic.eagle3_head import _copy_tokenizer

ARCH = "glm4moe"


@dataclass(frozen=True)
class MtpShape:
    n_embd: int = 64
    n_layer: int = 2  # trunk layers; the NextN layer is block n_layer
    n_head: int = 4
    n_kv_head: int = 2
    n_ff: int = 128
    n_expert: int = 4
    n_expert_used: int = 2
    n_ff_expert: int = 32
    context_length: int = 4096
    crafted: bool = False  # drafts that mostly agree with the target (see the module's docstring)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def write_mtp_target(path: Path, tokenizer_gguf: Path, shape: MtpShape = MtpShape(), seed: int = 0) -> Path:
    """Write the target with one NextN layer to `path`, its tokenizer taken from `tokenizer_gguf`."""
    reader = GGUFReader(tokenizer_gguf)
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), ARCH)
    for key, value in (
        ("context_length", shape.context_length),
        ("embedding_length", shape.n_embd),
        ("block_count", shape.n_layer + 1),  # llama.cpp counts the NextN block among the blocks
        ("feed_forward_length", shape.n_ff),
        ("attention.head_count", shape.n_head),
        ("attention.head_count_kv", shape.n_kv_head),
        ("expert_count", shape.n_expert),
        ("expert_used_count", shape.n_expert_used),
        ("expert_feed_forward_length", shape.n_ff_expert),
        ("expert_shared_count", 0),
        ("leading_dense_block_count", shape.n_layer),
        ("nextn_predict_layers", 1),
        ("rope.dimension_count", shape.head_dim),
    ):
        writer.add_uint32(f"{ARCH}.{key}", value)
    writer.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_float32(f"{ARCH}.rope.freq_base", 10000.0)
    _copy_tokenizer(reader, writer)
    for name, array in _tensors(shape, n_vocab, rng):
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _tensors(shape: MtpShape, n_vocab: int, rng: np.random.Generator):
    e, hd = shape.n_embd, shape.head_dim

    def normal(*ggml_shape: int) -> np.ndarray:  # numpy's order is ggml's reversed
        return (rng.standard_normal(ggml_shape[::-1]) * 0.05).astype(np.float32)

    def into_stream(*ggml_shape: int, nextn: bool = False) -> np.ndarray:  # what a layer adds to the residual
        weights = normal(*ggml_shape)
        return weights * (0.0 if nextn else 0.004) if shape.crafted else weights

    def ones(n: int) -> np.ndarray:
        return np.ones(n, np.float32)

    yield "token_embd.weight", normal(e, n_vocab)
    yield "output_norm.weight", ones(e)
    yield "output.weight", normal(e, n_vocab)
    for i in range(shape.n_layer + 1):
        b = f"blk.{i}"
        yield f"{b}.attn_norm.weight", ones(e)
        yield f"{b}.attn_q.weight", normal(e, shape.n_head * hd)
        yield f"{b}.attn_k.weight", normal(e, shape.n_kv_head * hd)
        yield f"{b}.attn_v.weight", normal(e, shape.n_kv_head * hd)
        yield f"{b}.attn_output.weight", into_stream(shape.n_head * hd, e, nextn=i == shape.n_layer)
        yield f"{b}.post_attention_norm.weight", ones(e)
        if i < shape.n_layer:
            yield f"{b}.ffn_gate.weight", normal(e, shape.n_ff)
            yield f"{b}.ffn_up.weight", normal(e, shape.n_ff)
            yield f"{b}.ffn_down.weight", into_stream(shape.n_ff, e)
            continue
        # the NextN block: GLM-4.5's MoE layer, and the projection of [enorm(embd(t)), hnorm(h)]
        n_exp, ff = shape.n_expert, shape.n_ff_expert
        yield f"{b}.ffn_gate_inp.weight", normal(e, n_exp)
        yield f"{b}.exp_probs_b.bias", np.zeros(n_exp, np.float32)
        yield f"{b}.ffn_gate_exps.weight", normal(e, ff, n_exp)
        yield f"{b}.ffn_up_exps.weight", normal(e, ff, n_exp)
        yield f"{b}.ffn_down_exps.weight", into_stream(ff, e, n_exp, nextn=True)
        passed = np.hstack([np.eye(e), np.zeros((e, e))]).astype(np.float32)  # [enorm(embd(t)), hnorm(h)] -> the first
        yield f"{b}.nextn.eh_proj.weight", passed if shape.crafted else normal(2 * e, e)
        yield f"{b}.nextn.enorm.weight", ones(e)
        yield f"{b}.nextn.hnorm.weight", ones(e)
        yield f"{b}.nextn.shared_head_norm.weight", ones(e)
