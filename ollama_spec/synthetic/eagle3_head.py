"""Synthetic EAGLE-3 draft heads over a synthetic llama target, written with the `gguf` package.

llama.cpp's `eagle3` architecture (src/models/eagle3.cpp) reads one layer: the encoder turns the
target's three captured layer inputs into g (`fc`), the decoder reads (token, g) per position and
predicts the token after that token. Three kinds for tests and demos:

- `random`: every matrix random; its guesses are the target's only by chance.
- `crafted`: a head that predicts `next_token[t]` after token t (a table, e.g. the target's own
  greedy bigrams): its own token embeddings carry a constant part, from which attention's q and k are
  built so that each position attends to itself (RoPE at a tiny base makes every other distance score
  far lower), and a one-hot-like code of the token that V and the output matrix read; g is zeroed out
  (`norm_before_residual` with a zero hidden norm), so the head is a bigram table run as a transformer.
- `reduced`: the crafted head over the tokens in `draft_vocab` only (an `output` of fewer rows, `d2t`
  naming each row's target id), as published heads for 128k vocabularies are.
- `bag`: each position attends to every position its cache holds alike (q = k = 0), and its logits
  are each token's code against the mean of the codes there: they say exactly which tokens the
  head's cache pairs with which positions (a test of the (t[P+1], g[P]) pairing).

The keys are plain strings: gguf 0.19 has no EAGLE-3 constants (../shared/HEADS.md).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType

HEAD_KINDS = ("random", "crafted", "reduced", "bag")
ARCH = "eagle3"
# The crafted head's RoPE: distances other than 0 then turn q·k to pseudo-random angles, so a
# position attends to itself (every other score well under its own).
CRAFTED_ROPE_BASE = 1e-6
SELF_SCORE = 80.0  # q·k of a position with itself, after llama.cpp's 1/sqrt(head_dim)
OUTPUT_SCALE = 12.0  # logit of the predicted token over a random one, in units of code overlap


@dataclass(frozen=True)
class HeadShape:
    n_embd: int = 128
    n_head: int = 2
    n_ff: int = 64
    context_length: int = 8192
    rms_eps: float = 1e-5

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def default_target_layers(n_layer: int) -> tuple[int, int, int]:
    """llama.cpp's converter's default when a checkpoint names none: [2, N/2, N-3], kept inside the target."""
    return min(2, n_layer - 1), n_layer // 2, max(0, n_layer - 3)


def write_eagle3_head(
    path: Path,
    target_gguf: Path,
    kind: str,
    *,
    next_token: np.ndarray | None = None,
    draft_vocab: Sequence[int] | None = None,
    target_layers: tuple[int, int, int] | None = None,
    shape: HeadShape = HeadShape(),
    seed: int = 5,
    fc_first_layer_only: bool = False,
    borrow_embeddings: bool = False,
) -> None:
    """Write an EAGLE-3 head for the llama GGUF `target_gguf` (its tokenizer copied) to `path`.

    `next_token[t]` (crafted, reduced): the token the head predicts after t; `draft_vocab`
    (reduced): the target ids the head can propose, in the order of its output rows.
    `fc_first_layer_only`: the encoder reads the first named layer's input alone (with layer 0, the
    target's token embedding: a test can compute each g from the target's weights).
    `borrow_embeddings` (random): no token embeddings or output matrix of its own: llama.cpp takes the
    target's (as the published Llama 3.1 8B head does its embeddings)."""
    if kind not in HEAD_KINDS:
        raise ValueError(f"unknown head kind {kind!r}: choose {', '.join(HEAD_KINDS)}")
    reader = GGUFReader(target_gguf)
    target_arch = str(reader.fields["general.architecture"].contents())
    n_tgt = int(reader.fields[f"{target_arch}.embedding_length"].contents())
    n_layer = int(reader.fields[f"{target_arch}.block_count"].contents())
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].contents())
    layers = target_layers or default_target_layers(n_layer)
    tensors, flags = _head_tensors(kind, shape, n_tgt, n_vocab, next_token, draft_vocab, seed)
    writer = GGUFWriter(path, arch=ARCH)
    _write_keys(writer, kind, shape, layers, n_tgt, flags)
    _copy_tokenizer(reader, writer)
    if fc_first_layer_only:
        tensors["fc.weight"][:, n_tgt:] = 0.0
    if borrow_embeddings:
        if kind != "random" or shape.n_embd != n_tgt:
            raise ValueError("only a random head as wide as its target borrows the target's embeddings")
        del tensors["token_embd.weight"], tensors["output.weight"]
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _head_tensors(
    kind: str,
    shape: HeadShape,
    n_tgt: int,
    n_vocab: int,
    next_token: np.ndarray | None,
    draft_vocab: Sequence[int] | None,
    seed: int,
) -> tuple[dict[str, np.ndarray], dict[str, bool]]:
    """The head's tensors and its eagle3 flags, by `kind` (write_eagle3_head)."""
    if kind == "random":
        tensors, flags = _random_tensors(shape, n_tgt, n_vocab, seed), {}
    elif kind == "bag":
        tensors, flags = _crafted_tensors(shape, n_tgt, n_vocab, np.arange(n_vocab), None, seed)
        half = shape.n_embd // 2
        tensors["blk.0.attn_q.weight"] = np.zeros_like(tensors["blk.0.attn_q.weight"])
        tensors["blk.0.attn_k.weight"] = np.zeros_like(tensors["blk.0.attn_k.weight"])
        tensors["output.weight"][:, half:] = tensors["token_embd.weight"][:, half:]
    else:
        if next_token is None:
            raise ValueError("a crafted head needs next_token")
        rows = list(draft_vocab) if kind == "reduced" else None
        tensors, flags = _crafted_tensors(shape, n_tgt, n_vocab, np.asarray(next_token), rows, seed)
    return tensors, flags


def _write_keys(
    writer: GGUFWriter, kind: str, shape: HeadShape, layers: Sequence[int], n_tgt: int, flags: dict[str, bool]
) -> None:
    writer.add_name(f"synthetic eagle3 head ({kind})")
    writer.add_file_type(LlamaFileType.ALL_F32)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.n_embd)
    writer.add_block_count(1)
    writer.add_feed_forward_length(shape.n_ff)
    writer.add_head_count(shape.n_head)
    writer.add_head_count_kv(shape.n_head)
    writer.add_layer_norm_rms_eps(shape.rms_eps)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_rope_freq_base(CRAFTED_ROPE_BASE if kind != "random" else 10000.0)
    writer.add_array(f"{ARCH}.target_layers", [int(layer) for layer in layers])
    writer.add_uint32(f"{ARCH}.target_hidden_size", n_tgt)
    for key, value in flags.items():
        writer.add_bool(f"{ARCH}.{key}", value)


def _normal(seed: int, name: str, shape: tuple[int, ...], std: float) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def _layer(shape: HeadShape, seed: int) -> dict[str, np.ndarray]:
    """Block 0 with random weights (numpy shapes are [out, in]; attention reads 2·n_embd)."""
    d, ff = shape.n_embd, shape.n_ff
    ones = np.ones(d, dtype=np.float32)
    return {
        "blk.0.attn_norm.weight": ones,
        "blk.0.attn_norm_2.weight": ones.copy(),
        "blk.0.attn_q.weight": _normal(seed, "q", (d, 2 * d), 1 / np.sqrt(2 * d)),
        "blk.0.attn_k.weight": _normal(seed, "k", (d, 2 * d), 1 / np.sqrt(2 * d)),
        "blk.0.attn_v.weight": _normal(seed, "v", (d, 2 * d), 1 / np.sqrt(2 * d)),
        "blk.0.attn_output.weight": _normal(seed, "o", (d, d), 1 / np.sqrt(d)),
        "blk.0.ffn_norm.weight": ones.copy(),
        "blk.0.ffn_gate.weight": _normal(seed, "gate", (ff, d), 1 / np.sqrt(d)),
        "blk.0.ffn_up.weight": _normal(seed, "up", (ff, d), 1 / np.sqrt(d)),
        "blk.0.ffn_down.weight": _normal(seed, "down", (d, ff), 1 / np.sqrt(ff)),
    }


def _random_tensors(shape: HeadShape, n_tgt: int, n_vocab: int, seed: int) -> dict[str, np.ndarray]:
    d = shape.n_embd
    return {
        "fc.weight": _normal(seed, "fc", (d, 3 * n_tgt), 1 / np.sqrt(3 * n_tgt)),
        "token_embd.weight": _normal(seed, "token_embd", (n_vocab, d), 1.0),
        "output_norm.weight": np.ones(d, dtype=np.float32),
        "output.weight": _normal(seed, "output", (n_vocab, d), 4.0 / np.sqrt(d)),
        **_layer(shape, seed),
    }


def _crafted_tensors(
    shape: HeadShape, n_tgt: int, n_vocab: int, next_token: np.ndarray, rows: list[int] | None, seed: int
) -> tuple[dict[str, np.ndarray], dict[str, bool]]:
    d, hd = shape.n_embd, shape.head_dim
    half = d // 2  # token embedding: [constant part | unit code of the token]
    codes = _normal(seed, "codes", (n_vocab, d - half), 1.0)
    codes /= np.linalg.norm(codes, axis=1, keepdims=True)
    embd = np.zeros((n_vocab, d), dtype=np.float32)
    embd[:, :half] = 1.0 / np.sqrt(half)
    embd[:, half:] = codes  # every row the same norm: RMSNorm scales all rows alike
    scale = np.sqrt(d / 2.0)  # RMSNorm of a row of norm sqrt(2)
    tensors = _layer(shape, seed)
    # q = k: the constant part, into every head's dims; with llama.cpp's 1/sqrt(head_dim), q·k at
    # distance 0 is SELF_SCORE
    qk = np.zeros((d, 2 * d), dtype=np.float32)
    amplitude = np.sqrt(SELF_SCORE / np.sqrt(hd))
    for out in range(d):
        qk[out, out % half] = amplitude * np.sqrt(half) / scale
    v = np.zeros((d, 2 * d), dtype=np.float32)
    v[half:, half:d] = np.eye(d - half, dtype=np.float32) / scale  # v = the token's code
    zero = lambda name: np.zeros_like(tensors[name])
    tensors |= {
        "blk.0.attn_norm_2.weight": np.zeros(d, dtype=np.float32),  # g reaches nothing
        "blk.0.attn_q.weight": qk,
        "blk.0.attn_k.weight": qk.copy(),
        "blk.0.attn_v.weight": v,
        "blk.0.attn_output.weight": np.eye(d, dtype=np.float32),
        "blk.0.ffn_down.weight": zero("blk.0.ffn_down.weight"),
    }
    # the output row of token u: the codes of the tokens after which u comes next
    ids = np.arange(n_vocab) if rows is None else np.asarray(rows)
    where = {int(u): i for i, u in enumerate(ids)}
    output = np.zeros((len(ids), d), dtype=np.float32)
    for t, u in enumerate(next_token):
        if int(u) in where:
            output[where[int(u)], half:] += codes[t] * OUTPUT_SCALE / np.sqrt(d)
    tensors |= {
        "fc.weight": _normal(seed, "fc", (d, 3 * n_tgt), 1 / np.sqrt(3 * n_tgt)),
        "token_embd.weight": embd,
        "output_norm.weight": np.ones(d, dtype=np.float32),
        "output.weight": output,
    }
    if rows is not None:
        tensors["d2t"] = ids.astype(np.int64)
    return tensors, {"norm_before_residual": True}


def _copy_tokenizer(reader: GGUFReader, writer: GGUFWriter) -> None:
    """The target's `tokenizer.ggml.*` keys, as they are."""
    for name, field in reader.fields.items():
        if not name.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == GGUFValueType.ARRAY:
            writer.add_array(name, list(field.contents()))
        elif kind == GGUFValueType.STRING:
            writer.add_string(name, field.contents())
        else:
            writer.add_key_value(name, field.contents(), kind)
