"""The synthetic EAGLE-3 heads over tiny-target (synthetic/eagle3_head.py): random, crafted from the
target's own greedy bigrams, the crafted one over a reduced vocabulary with d2t, and a random one that
borrows the target's embeddings and output matrix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGUFReader

from ollama_spec.llama.model import LoadedModel, LoadSettings
from ollama_spec.synthetic.eagle3_head import HeadShape, write_eagle3_head

TARGET_LAYERS = (0, 2, 3)  # tiny-target has 4 layers: the first's input is the token embedding
BIGRAM_PROMPTS = [f"Text number {i}: " + "abcdefghijklmnopqrstuvwxyz"[i % 26] * (i % 5 + 1) for i in range(24)]


def greedy_bigrams(target_path: Path, steps: int = 120) -> np.ndarray:
    """After each token, the token the target most often writes next in greedy texts from BIGRAM_PROMPTS
    (itself where it was never seen): a table a head can learn, as a real head learns from the target."""
    with LoadedModel(target_path, LoadSettings(n_ctx=1024, n_threads=1)) as model:
        counts: dict[int, dict[int, int]] = {}
        for prompt in BIGRAM_PROMPTS:
            model.truncate(0)
            seq = model.tokenize(prompt, add_bos=True, special=False)
            logits = model.eval(seq)
            for _ in range(steps):
                token = int(logits[-1].argmax())
                seen = counts.setdefault(seq[-1], {})
                seen[token] = seen.get(token, 0) + 1
                seq.append(token)
                logits = model.eval([token])
        table = np.arange(model.n_vocab)
    for token, seen in counts.items():
        table[token] = max(seen, key=seen.get)
    return table


def build_heads(target_path: Path, root: Path) -> dict[str, Path]:
    """The three heads' GGUFs in `root`, by kind."""
    table = greedy_bigrams(target_path)
    # the reduced head: the tokens the table predicts and a few hundred others, in a shuffled order
    rng = np.random.default_rng(3)
    kept = sorted(set(table.tolist()) | set(rng.choice(len(table), len(table) // 2, replace=False).tolist()))
    draft_vocab = rng.permutation(kept)
    paths = {}
    for kind in ("random", "crafted", "reduced"):
        paths[kind] = root / f"head-{kind}.gguf"
        write_eagle3_head(
            paths[kind], target_path, kind, next_token=table, draft_vocab=draft_vocab, target_layers=TARGET_LAYERS
        )
    # a random head that reads the target's token embeddings and output matrix (ctx_other)
    paths["borrowing"] = root / "head-borrowing.gguf"
    n_embd = next(t.shape[0] for t in GGUFReader(target_path).tensors if t.name == "token_embd.weight")
    write_eagle3_head(
        paths["borrowing"],
        target_path,
        "random",
        target_layers=TARGET_LAYERS,
        shape=HeadShape(n_embd=int(n_embd)),
        borrow_embeddings=True,
    )
    return paths
