"""A small F16 pair whose target's two best tokens are often close (issue #45's kind of pair, smaller).

The family's pairs spread their logits by several units so that greedy choices do not flip between
batch sizes; this one spreads them by one, so rounding that differs between two arrangements of the
same tokens changes its greedy text within a few dozen tokens, as it did on the 0.3B F16 pair served
four at once. Small enough to generate hundreds of tokens a second on one core.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from ollama_spec.synthetic.layout import write_model
from ollama_spec.synthetic.models import Architecture, WeightRecipe, make_weights, write_gguf
from ollama_spec.synthetic.tokenizer import EOT, build_vocabulary

TARGET, DRAFT = "close-target", "close-draft"
ARCH = Architecture(n_embd=256, n_layer=4, n_head=4, n_kv_head=2, n_ff=512, context_length=4096)
VOCAB = (1024, 300)


def build_close_pair(root: Path) -> tuple[str, str]:
    """Write the target and its 1-layer draft (both F16) into the store at `root`; return their names."""
    vocab = build_vocabulary(*VOCAB)
    quiet = tuple(i for i in range(256) if not 32 <= i < 127)
    recipe = WeightRecipe(
        seed=45,
        dtype="F16",
        residual_scale=0.05,
        logit_std=0.5,
        eot_after=(vocab.id_of("."), vocab.id_of(EOT)),
        quiet_tokens=quiet,
    )
    weights = make_weights(ARCH, vocab.size, recipe, 1)
    for name, n_layer in ((TARGET, ARCH.n_layer), (DRAFT, 1)):
        with tempfile.TemporaryDirectory(dir=root, prefix=".staging-") as tmp:
            path = Path(tmp) / "model.gguf"
            write_gguf(path, name=name, arch=ARCH, n_layer=n_layer, vocab=vocab, weights=weights, dtype="F16")
            write_model(root, name, path)
    return TARGET, DRAFT
