"""A synthetic pair with real shapes and quantizations: a wide target that contains a narrower draft.

The family's rule (models.py) is "the draft is the target's first layers; the target's other
layers nudge the result". With real shapes the two differ in width (Llama 3.1 8B: 4096 wide,
head size 128; Llama 3.2 1B: 2048, head size 64), so the draft is nested inside the target:

- the draft's residual stream is the target's first `n_embd` dimensions; the target's
  embeddings and output matrix are the draft's padded with zero columns;
- each of the draft's layers sits in the matching target layer: its Q/K/V rows in the same
  heads, RoPE pair i of a draft head at pair r·i of the target head (r = head-size ratio, so the
  rotation frequencies match), Q scaled by √r to undo the larger softmax scale, the FFN in the
  first rows; everything else in those layers is zero, and the RMS-norm weights (√(n_draft/n_target)
  on the draft's dimensions, 0 beyond) make the target normalize as the draft does;
- the target's remaining layers are random and write small updates (`residual_scale`) over the
  whole width: how often the two models agree follows from that scale, as in the small family.

The target's matrices are written as random Q4_K/Q6_K blocks (kquant_blocks.py), with llama.cpp's
Q4_K_M type choices; the draft's are read back out of them (dequantized) and stored as Q8_0, so
the draft is the target's own weights up to Q8_0 rounding. Nothing is an 8B float array: the
pair builds in about a minute.
"""

from __future__ import annotations

import tempfile
import zlib
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import LlamaFileType, quants

from ollama_spec.synthetic.kquant_blocks import QK_K, live_mask, random_blocks
from ollama_spec.synthetic.layout import write_model
from ollama_spec.synthetic.models import LLAMA3_CHAT_TEMPLATE, Architecture, add_vocabulary, new_llama_writer
from ollama_spec.synthetic.tokenizer import build_vocabulary


@dataclass(frozen=True)
class NestedSpec:
    target_name: str
    draft_name: str
    target: Architecture
    draft: Architecture
    vocab_size: int
    n_merges: int
    seed: int
    residual_scale: float  # the target-only layers' output projections, relative to a full layer
    draft_scale: float = 1.0  # the shared layers' output projections
    logit_std: float = 4.0
    description: str = ""


LLAMA31_CTX = 131072
TINY = NestedSpec(
    "nested-target:q4_k_m",
    "nested-draft:q8_0",
    Architecture(n_embd=512, n_layer=4, n_head=8, n_kv_head=2, n_ff=1024),
    Architecture(n_embd=256, n_layer=2, n_head=8, n_kv_head=2, n_ff=512),
    vocab_size=2048,
    n_merges=600,
    seed=31,
    residual_scale=0.03,
    description="the same construction at toy size, for CPU checks of the GPU benchmark",
)
NESTED: dict[str, NestedSpec] = {
    "8b-1b": NestedSpec(
        "synth-8b:q4_k_m",
        "synth-1b:q8_0",
        Architecture(n_embd=4096, n_layer=32, n_head=32, n_kv_head=8, n_ff=14336, context_length=LLAMA31_CTX),
        Architecture(n_embd=2048, n_layer=16, n_head=32, n_kv_head=8, n_ff=8192, context_length=LLAMA31_CTX),
        vocab_size=128256,
        n_merges=600,
        seed=31,
        residual_scale=0.07,
        description="Llama-3.1-8B-shaped Q4_K_M target, Llama-3.2-1B-shaped Q8_0 draft (untied output)",
    ),
    "tiny": TINY,
    # The toy pair with Llama 3's vocabulary: its passes are mostly the output matrix and the logits read,
    # so a verify batch costs about one target step a token and no K pays (0.7-0.8x the target alone), as
    # on the H200 run (docs/benchmarks/h200-8b-1b): where -k auto must settle on the target alone.
    "tiny-128k": replace(
        TINY,
        target_name="nested128k-target:q4_k_m",
        draft_name="nested128k-draft:q8_0",
        vocab_size=128256,
        description="the toy-size pair with Llama 3's 128,256-token vocabulary (171 MB): where no K pays",
    ),
}


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's rule (llama-quant.cpp) for the Q4_K_M layers whose attn_v and ffn_down get Q6_K."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


class _Maps:
    """Where each draft row/column sits in the target (index arrays into the target's axes)."""

    def __init__(self, t: Architecture, d: Architecture):
        if (t.n_head, t.n_kv_head) != (d.n_head, d.n_kv_head) or t.head_dim % d.head_dim or d.head_dim % 2:
            raise ValueError("nesting needs equal head counts and a target head size that is a multiple of the draft's")
        if t.n_embd < d.n_embd or t.n_ff < d.n_ff or t.n_layer < d.n_layer:
            raise ValueError("the draft must be narrower and shallower than the target")
        self.ratio = t.head_dim // d.head_dim
        j = np.arange(d.head_dim)
        in_head_rope = self.ratio * (j - j % 2) + j % 2  # pair i -> pair ratio*i
        self.q = (np.arange(d.n_head)[:, None] * t.head_dim + in_head_rope).ravel()
        self.k = (np.arange(d.n_kv_head)[:, None] * t.head_dim + in_head_rope).ravel()
        self.v = (np.arange(d.n_kv_head)[:, None] * t.head_dim + j).ravel()
        self.o = (np.arange(d.n_head)[:, None] * t.head_dim + j).ravel()
        self.embd, self.ff = np.arange(d.n_embd), np.arange(d.n_ff)


@dataclass
class _Pair:
    target: dict  # name -> (array, raw qtype or None for F32)
    draft: dict


def build_nested_pair(spec: NestedSpec, workers: int = 8) -> _Pair:
    """All tensors of both models: the target's as K-quant blocks, the draft's as Q8_0."""
    builder = _PairBuilder(spec)
    jobs = builder.top_jobs()
    for i in range(spec.target.n_layer):
        jobs += builder.shared_layer_jobs(i) if i < spec.draft.n_layer else builder.target_layer_jobs(i)
    with ThreadPoolExecutor(workers) as pool:  # numpy lets go of the GIL in the big array operations
        for future in [pool.submit(job) for job in jobs]:
            future.result()
    return builder.pair


class _PairBuilder:
    """The pair's tensors: the norms at once, the matrices as jobs (`nested`, `target_only`) run on threads."""

    def __init__(self, spec: NestedSpec):
        self.spec, self.t, self.d = spec, spec.target, spec.draft
        self.maps = _Maps(self.t, self.d)
        self.pair = _Pair({}, {})
        t, d = self.t, self.d
        self.norm_in = np.where(np.arange(t.n_embd) < d.n_embd, np.sqrt(d.n_embd / t.n_embd), 0).astype(np.float32)
        self.ones_t, self.ones_d = np.ones(t.n_embd, np.float32), np.ones(d.n_embd, np.float32)
        self.kv_t = t.n_kv_head * t.head_dim

    def nested(
        self,
        name: str,
        qtype: T,
        shape: tuple[int, int],
        std: float,
        rows: np.ndarray,
        cols: np.ndarray,
        scale: float = 1.0,
        draft_name: str | None = None,
    ) -> None:
        """One target matrix holding a draft matrix (std is the draft's)."""
        rng = _rng(self.spec.seed, name)
        row_live, col_live = np.zeros(shape[0], bool), np.zeros(shape[1], bool)
        row_live[rows], col_live[cols] = True, True
        blocks = random_blocks(qtype, *shape, std * scale, rng, live_mask(qtype, row_live, col_live))
        self.pair.target[name] = (blocks, qtype)
        picked = blocks[rows]
        if np.array_equal(cols, np.arange(len(cols))) and len(cols) % QK_K == 0:  # a prefix: whole blocks
            picked = picked[:, : picked.shape[1] * len(cols) // shape[1]]
            values = quants.dequantize(picked, qtype)
        else:
            values = quants.dequantize(picked, qtype)[:, cols]
        values = values / np.float32(scale) if scale != 1.0 else values
        self.pair.draft[draft_name or name] = (
            quants.quantize(np.ascontiguousarray(values, np.float32), T.Q8_0),
            T.Q8_0,
        )

    def target_only(self, name: str, qtype: T, shape: tuple[int, int], std: float) -> None:
        self.pair.target[name] = (random_blocks(qtype, *shape, std, _rng(self.spec.seed, name)), qtype)

    def top_jobs(self) -> list[Callable[[], None]]:
        """The embeddings and the output matrix (jobs), the output norms (at once)."""
        spec, t, d, maps = self.spec, self.t, self.d, self.maps
        vocab = np.arange(spec.vocab_size)
        output_std = spec.logit_std / np.sqrt(d.n_embd)
        jobs = [
            partial(self.nested, "token_embd.weight", T.Q4_K, (spec.vocab_size, t.n_embd), 1.0, vocab, maps.embd),
            partial(self.nested, "output.weight", T.Q6_K, (spec.vocab_size, t.n_embd), output_std, vocab, maps.embd),
        ]
        self.pair.target["output_norm.weight"] = (self.norm_in, None)
        self.pair.draft["output_norm.weight"] = (self.ones_d, None)
        return jobs

    def shared_layer_jobs(self, i: int) -> list[Callable[[], None]]:
        """Layer i of the target holding layer i of the draft."""
        t, d, maps, kv_t, nested = self.t, self.d, self.maps, self.kv_t, self.nested
        p = f"blk.{i}."
        v_type = down_type = T.Q6_K if use_more_bits(i, t.n_layer) else T.Q4_K
        s, out = 1 / np.sqrt(d.n_embd), self.spec.draft_scale
        q_scale = np.sqrt(maps.ratio)
        jobs = [
            partial(nested, p + "attn_q.weight", T.Q4_K, (t.n_embd, t.n_embd), s, maps.q, maps.embd, scale=q_scale),
            partial(nested, p + "attn_k.weight", T.Q4_K, (kv_t, t.n_embd), s, maps.k, maps.embd),
            partial(nested, p + "attn_v.weight", v_type, (kv_t, t.n_embd), s, maps.v, maps.embd),
            partial(nested, p + "attn_output.weight", T.Q4_K, (t.n_embd, t.n_embd), out * s, maps.embd, maps.o),
            partial(nested, p + "ffn_gate.weight", T.Q4_K, (t.n_ff, t.n_embd), s, maps.ff, maps.embd),
            partial(nested, p + "ffn_up.weight", T.Q4_K, (t.n_ff, t.n_embd), s, maps.ff, maps.embd),
            partial(
                nested, p + "ffn_down.weight", down_type, (t.n_embd, t.n_ff), out / np.sqrt(d.n_ff), maps.embd, maps.ff
            ),
        ]
        self.pair.target |= {p + "attn_norm.weight": (self.norm_in, None), p + "ffn_norm.weight": (self.norm_in, None)}
        self.pair.draft |= {p + "attn_norm.weight": (self.ones_d, None), p + "ffn_norm.weight": (self.ones_d, None)}
        return jobs

    def target_layer_jobs(self, i: int) -> list[Callable[[], None]]:
        """Layer i of the target past the draft's layers: random, writing small updates."""
        t, kv_t, target_only = self.t, self.kv_t, self.target_only
        p = f"blk.{i}."
        v_type = down_type = T.Q6_K if use_more_bits(i, t.n_layer) else T.Q4_K
        s, r = 1 / np.sqrt(t.n_embd), self.spec.residual_scale
        jobs = [
            partial(target_only, p + "attn_q.weight", T.Q4_K, (t.n_embd, t.n_embd), s),
            partial(target_only, p + "attn_k.weight", T.Q4_K, (kv_t, t.n_embd), s),
            partial(target_only, p + "attn_v.weight", v_type, (kv_t, t.n_embd), s),
            partial(target_only, p + "attn_output.weight", T.Q4_K, (t.n_embd, t.n_embd), r * s),
            partial(target_only, p + "ffn_gate.weight", T.Q4_K, (t.n_ff, t.n_embd), s),
            partial(target_only, p + "ffn_up.weight", T.Q4_K, (t.n_ff, t.n_embd), s),
            partial(target_only, p + "ffn_down.weight", down_type, (t.n_embd, t.n_ff), r / np.sqrt(t.n_ff)),
        ]
        self.pair.target |= {p + "attn_norm.weight": (self.ones_t, None), p + "ffn_norm.weight": (self.ones_t, None)}
        return jobs


def build_nested_store(
    root: Path, profile: str = "8b-1b", *, progress: Callable[[str], None] = lambda m: None, skip_existing: bool = True
) -> list[str]:
    """Build a NESTED pair into an Ollama-layout store at `root`; return the target and draft names."""
    from ollama_spec.synthetic.catalog import _manifest

    spec = NESTED[profile]
    names = [spec.target_name, spec.draft_name]
    root.mkdir(parents=True, exist_ok=True)
    if skip_existing and all(_manifest(root, name).exists() for name in names):
        return names
    progress(f"generating {spec.description}")
    vocab = build_vocabulary(spec.vocab_size, spec.n_merges)
    pair = build_nested_pair(spec)
    for name, arch, tensors, file_type in (
        (spec.target_name, spec.target, pair.target, LlamaFileType.MOSTLY_Q4_K_M),
        (spec.draft_name, spec.draft, pair.draft, LlamaFileType.MOSTLY_Q8_0),
    ):
        progress(f"writing {name} ({arch.n_layer} layers)")
        with tempfile.TemporaryDirectory(dir=root, prefix=".staging-") as tmp:
            path = Path(tmp) / "model.gguf"
            writer = new_llama_writer(path, name, arch, arch.n_layer, file_type)
            add_vocabulary(writer, vocab)
            writer.add_add_bos_token(True)
            writer.add_add_eos_token(False)
            writer.add_chat_template(LLAMA3_CHAT_TEMPLATE)
            for tensor_name in _tensor_order(arch.n_layer):
                array, qtype = tensors[tensor_name]
                if qtype is None:
                    writer.add_tensor(tensor_name, array)
                else:
                    writer.add_tensor(tensor_name, array, raw_dtype=qtype)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
            writer.close()
            write_model(root, name, path)
    return names


def _tensor_order(n_layer: int) -> list[str]:
    names = ["token_embd.weight", "output_norm.weight", "output.weight"]
    for i in range(n_layer):
        names += [
            f"blk.{i}.{n}.weight"
            for n in (
                "attn_norm",
                "attn_q",
                "attn_k",
                "attn_v",
                "attn_output",
                "ffn_norm",
                "ffn_gate",
                "ffn_up",
                "ffn_down",
            )
        ]
    return names


def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode())])
