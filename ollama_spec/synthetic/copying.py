"""A synthetic pair whose target copies its input, for the hybrid proposer's benchmark (--draft MODEL
--ngram): no random-weight model repeats what it read, so prompt lookup never finds anything to
propose on the other pairs, and a pair where both a draft model pays and the answer copies its input
has to be built for the purpose.

The target is a hand-set llama (every weight chosen, none trained):

- layer 0: two previous-token heads write the identity of the token 1 and 2 places back into their
  own parts of the residual stream (RoPE's fastest pairs, phased so the score peaks at that offset);
- layer 1: an induction head matches the last two tokens against every earlier pair (RoPE's slow
  pairs, which barely turn over a context: a large freq base) and copies the token that followed
  the match; a key on BOS takes the attention where nothing matches two tokens (an attention sink);
- the output reads the copied token strongly and the current token weakly, as a bigram: a fixed
  permutation, which is the target's own text wherever it does not copy;
- after a comma the induction head looks for nothing: the copy ends there and the bigram runs on;
- filler layers that add nothing (zero output projections) make its steps cost what a bigger
  model's would.

The draft is the bigram alone (one layer that adds nothing): it predicts the target's own text, and
fails where the target copies; prompt lookup does the opposite. A chat answer starts by copying the
user's message (its header ends as the assistant's does) up to the first comma, then writes bigram
text: the mixture where the hybrid should beat both.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from ollama_spec.synthetic.layout import write_model
from ollama_spec.synthetic.models import Architecture, write_gguf
from ollama_spec.synthetic.tokenizer import BOS, SPECIAL_TOKENS, Vocabulary, build_vocabulary

TARGET_NAME, DRAFT_NAME = "copy-target", "copy-draft"
VOCAB = (4096, 2500)  # longer tokens than the other pairs': fewer repeated pairs to copy ambiguously
CODE_DIMS = 44  # a token's identity: a random unit vector in this many dimensions
N_EMBD, HEAD_DIM = 512, 128
ROPE_BASE = 1e16  # RoPE's pairs 16..63 then turn < 0.1 rad over 1,000 tokens: position-blind matching
PREV_WEIGHTS = (4.0, 2.0, 1.0, 1.0, 0.5, 0.5)  # per fast pair; x3: the offset's score leads by >= 6
PREV_SCALE = 3.0
MATCH_SCORE = 12.0  # attention score per matching token; a match of both: 24
SINK_SCORE = 18.0  # BOS's: above one matching token, below two
STOP_SCORE = 30.0  # added to the sink's after a comma: the copy ends there
BIGRAM, COPY = 0.8, 4.0  # output weights: a half-split copy still outweighs the bigram
EDIT_PIECES = (",",)


def copy_pair_arch(n_filler: int, n_ff: int) -> Architecture:
    return Architecture(
        n_embd=N_EMBD,
        n_layer=2 + n_filler,
        n_head=N_EMBD // HEAD_DIM,
        n_kv_head=N_EMBD // HEAD_DIM,
        n_ff=n_ff,
        context_length=4096,
        rope_theta=ROPE_BASE,
    )


# the residual stream's parts: the token (A), the one before (B), two before (B2), the copied one (C);
# then a dimension that is always 1, one set on BOS alone and one on the edit pieces
_A, _B, _B2, _C = (slice(i * CODE_DIMS, (i + 1) * CODE_DIMS) for i in range(4))
_ONE, _BOS_DIM, _EDIT_DIM = 4 * CODE_DIMS, 4 * CODE_DIMS + 1, 4 * CODE_DIMS + 2


def copy_pair_weights(vocab: Vocabulary, arch: Architecture, seed: int = 5) -> tuple[dict, dict]:
    """(target, draft) tensors for `arch` (2 working layers, the rest filler), numpy [out, in]."""
    d, hd, n_ff = arch.n_embd, arch.head_dim, arch.n_ff
    embeddings, output = _token_matrices(vocab, d, np.random.default_rng(seed))
    target = {
        "token_embd.weight": embeddings,
        "output_norm.weight": np.ones(d, np.float32),
        "output.weight": output,
    }
    no_ff = np.zeros((n_ff, d), np.float32)
    target |= _layer(0, d, n_ff, *_previous_token_heads(d, hd), no_ff, no_ff)
    target |= _layer(1, d, n_ff, *_induction_head(d, hd), no_ff, no_ff)
    for i in range(2, arch.n_layer):  # filler: the cost of bigger layers, nothing added to the stream
        g = np.random.default_rng([seed, i])
        small = [(g.standard_normal(shape) * 0.02).astype(np.float32) for shape in [(d, d)] * 3 + [(n_ff, d)] * 2]
        target |= _layer(i, d, n_ff, *small[:3], np.zeros((d, d), np.float32), *small[3:])
    target = {name: t.astype(np.float16) if t.ndim == 2 else t for name, t in target.items()}
    draft = dict(target)
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):  # its one layer adds nothing: the bigram
        draft[f"blk.0.{name}.weight"] = np.zeros_like(target[f"blk.0.{name}.weight"])
    return target, draft


def _token_matrices(vocab: Vocabulary, d: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """The embeddings (each token's code in A) and the output matrix (the bigram on A, the copy on C)."""
    v = vocab.size
    special = {vocab.id_of(t) for t in SPECIAL_TOKENS}
    bos = vocab.id_of(BOS)
    ordinary = np.array([t for t in range(v) if t not in special])
    code = rng.standard_normal((v, CODE_DIMS))
    code /= np.linalg.norm(code, axis=1, keepdims=True)
    code[bos] = 0
    embeddings = np.zeros((v, d), np.float32)
    embeddings[:, _A], embeddings[:, _ONE], embeddings[bos, _BOS_DIM] = code, 1.0, 1.0
    for t in ordinary:
        if vocab.tokens[t] in EDIT_PIECES:
            embeddings[t, _EDIT_DIM] = 1.0
    before = np.zeros(v, int)  # the bigram is a permutation of the ordinary tokens: before[next] = token
    before[rng.permutation(ordinary)] = ordinary
    output = np.zeros((v, d), np.float32)
    output[ordinary, _A] = BIGRAM * code[before[ordinary]]
    output[:, _C] = COPY * code  # specials too: a copied end of turn ends the answer
    return embeddings, output


def _scales(d: int, hd: int) -> tuple[float, float, float]:
    """RMSNorm scales the stream to rms 1: by 16 where it holds 2 unit parts of 512, by 11.3 with 4;
    llama.cpp divides scores by sqrt(head_dim): each of q and k carries a fourth root."""
    return np.sqrt(d / 2), np.sqrt(d / 4), hd**0.25


def _previous_token_heads(d: int, hd: int) -> tuple[np.ndarray, ...]:
    """Layer 0's q, k, v, o: heads 0 and 1 write the token 1 and 2 places back into B and B2."""
    theta = ROPE_BASE ** (-2 * np.arange(hd // 2) / hd)
    norm2, _, root = _scales(d, hd)
    q0, k0, v0, o0 = (np.zeros((d, d), np.float32) for _ in range(4))
    for head, offset, part in ((0, 1, _B), (1, 2, _B2)):
        base = head * hd
        for pair, weight in enumerate(PREV_WEIGHTS):
            size, phase = np.sqrt(PREV_SCALE * weight) * root / norm2, -theta[pair] * offset
            q0[base + 2 * pair, _ONE], q0[base + 2 * pair + 1, _ONE] = size * np.cos(phase), size * np.sin(phase)
            k0[base + 2 * pair, _ONE] = size
        for r in range(CODE_DIMS):
            v0[base + r, _A.start + r] = 1 / norm2
            o0[part.start + r, base + r] = 1.0
    return q0, k0, v0, o0


def _induction_head(d: int, hd: int) -> tuple[np.ndarray, ...]:
    """Layer 1's q, k, v, o: the last two tokens matched against earlier pairs, what followed copied to C;
    BOS as the sink, and more so after an edit piece."""
    norm2, norm4, root = _scales(d, hd)
    q1, k1, v1, o1 = (np.zeros((d, d), np.float32) for _ in range(4))
    match = np.sqrt(MATCH_SCORE) * root / norm4
    for r in range(CODE_DIMS):  # slow pairs: dims 32.. of head 0
        q1[32 + r, _A.start + r], k1[32 + r, _B.start + r] = match, match
        q1[76 + r, _B.start + r], k1[76 + r, _B2.start + r] = match, match
        v1[r, _A.start + r], o1[_C.start + r, r] = 1 / norm4, 1.0
    q1[120, _ONE], k1[120, _BOS_DIM] = np.sqrt(SINK_SCORE) * root / norm4, np.sqrt(SINK_SCORE) * root / norm2
    q1[122, _EDIT_DIM], k1[122, _BOS_DIM] = np.sqrt(STOP_SCORE) * root / norm4, np.sqrt(STOP_SCORE) * root / norm2
    return q1, k1, v1, o1


def _layer(i: int, d: int, n_ff: int, q, k, v, o, gate, up) -> dict[str, np.ndarray]:
    p = f"blk.{i}."
    return {
        p + "attn_norm.weight": np.ones(d, np.float32),
        p + "attn_q.weight": q,
        p + "attn_k.weight": k,
        p + "attn_v.weight": v,
        p + "attn_output.weight": o,
        p + "ffn_norm.weight": np.ones(d, np.float32),
        p + "ffn_gate.weight": gate,
        p + "ffn_up.weight": up,
        p + "ffn_down.weight": np.zeros((d, n_ff), np.float32),  # no layer's feed-forward adds anything
    }


def build_copy_pair_store(root: Path, *, n_filler: int = 10, n_ff: int = 4096) -> list[str]:
    """Write copy-target (2 + n_filler layers) and copy-draft (1 layer) into the store at `root`."""
    vocab = build_vocabulary(*VOCAB)
    arch = copy_pair_arch(n_filler, n_ff)
    target, draft = copy_pair_weights(vocab, arch)
    root.mkdir(parents=True, exist_ok=True)
    for name, n_layer, weights in ((TARGET_NAME, arch.n_layer, target), (DRAFT_NAME, 1, draft)):
        with tempfile.TemporaryDirectory(dir=root, prefix=".staging-") as tmp:
            path = Path(tmp) / "model.gguf"
            write_gguf(path, name=name, arch=arch, n_layer=n_layer, vocab=vocab, weights=weights, dtype="F16")
            write_model(root, name, path)
    return [TARGET_NAME, DRAFT_NAME]
