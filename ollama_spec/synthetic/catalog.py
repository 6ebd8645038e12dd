"""The synthetic model family: which pairs exist and how to build them into a store."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ollama_spec.models.names import parse_model_name
from ollama_spec.synthetic.layout import write_model
from ollama_spec.synthetic.models import Architecture, WeightRecipe, make_weights, write_gguf
from ollama_spec.synthetic.tokenizer import EOT, build_vocabulary


@dataclass(frozen=True)
class PairSpec:
    """A target, its agreeing draft (the target's first `draft_layers` blocks) and their names."""

    target_name: str
    draft_name: str
    arch: Architecture
    draft_layers: int
    vocab_size: int
    n_merges: int
    recipe: WeightRecipe
    description: str
    # Also written as `name:q8_0`-style tags with these weight types (the same weights, quantized).
    quantized: tuple[str, ...] = ()

    def names(self) -> list[str]:
        """Target and draft, then each quantized target and draft."""
        return [self.target_name, self.draft_name] + [
            f"{name}:{q.lower()}" for q in self.quantized for name in (self.target_name, self.draft_name)
        ]


def _recipe(seed: int, vocab_size: int, n_merges: int, **kwargs) -> WeightRecipe:
    vocab = build_vocabulary(vocab_size, n_merges)
    # Raw bytes outside printable ASCII are damped so demo text stays readable.
    quiet = tuple(i for i in range(256) if not 32 <= i < 127)
    return WeightRecipe(seed=seed, eot_after=(vocab.id_of("."), vocab.id_of(EOT)), quiet_tokens=quiet, **kwargs)


PAIRS: dict[str, PairSpec] = {
    "tiny": PairSpec(
        target_name="tiny-target",
        draft_name="tiny-draft",
        arch=Architecture(n_embd=64, n_layer=4, n_head=4, n_kv_head=2, n_ff=128, context_length=8192),
        draft_layers=1,
        vocab_size=512,
        n_merges=200,
        recipe=_recipe(1, 512, 200, residual_scale=0.12),
        description="tiny F32 pair for tests (builds in well under a second)",
        quantized=("Q8_0", "Q4_0"),  # llama.cpp repacks these on some CPUs (AMX, AVX2, Arm)
    ),
    "bench": PairSpec(
        target_name="synth-target",
        draft_name="synth-draft",
        arch=Architecture(n_embd=2048, n_layer=13, n_head=16, n_kv_head=4, n_ff=5632, context_length=8192),
        draft_layers=1,
        vocab_size=2048,
        n_merges=600,
        recipe=_recipe(7, 2048, 600, dtype="F16", residual_scale=0.025),
        description="0.6B F16 target + 1-layer draft: memory-bound on a CPU, like a GPU",
    ),
    # Pairs for -k auto's benchmark (scripts/bench-auto-k.sh): other shapes, quantizations and draft
    # strengths than the bench pair, on which auto's constants are set.
    "strong": PairSpec(
        target_name="strong-target",
        draft_name="strong-draft",
        arch=Architecture(n_embd=1536, n_layer=12, n_head=12, n_kv_head=4, n_ff=4096, context_length=4096),
        draft_layers=1,
        vocab_size=3072,
        n_merges=800,
        recipe=_recipe(11, 3072, 800, dtype="F16", residual_scale=0.015),
        description="0.3B F16 target + 1-layer draft that agrees with it on most tokens",
    ),
    "weak": PairSpec(
        target_name="weak-target",
        draft_name="weak-draft",
        arch=Architecture(n_embd=2048, n_layer=10, n_head=16, n_kv_head=8, n_ff=5120, context_length=4096),
        draft_layers=2,
        vocab_size=2048,
        n_merges=600,
        recipe=_recipe(13, 2048, 600, dtype="F16", residual_scale=0.25),
        description="0.5B F16 target + 2-layer draft that agrees with it on about half the tokens",
    ),
    "quant": PairSpec(
        target_name="quant-target",
        draft_name="quant-draft",
        arch=Architecture(n_embd=1024, n_layer=8, n_head=8, n_kv_head=4, n_ff=2816, context_length=4096),
        draft_layers=2,
        vocab_size=2048,
        n_merges=600,
        recipe=_recipe(17, 2048, 600, residual_scale=0.03),
        description="small quantized pair (quant-target:q4_0, quant-draft:q8_0): compute-bound on a CPU",
        quantized=("Q8_0", "Q4_0"),
    ),
}
# A draft whose vocabulary cannot work with the tiny target (for errors and tests).
ALIEN_NAME = "tiny-alien"
ALIEN_VOCAB = (1024, 200)


def build_pair_store(
    root: Path, pair: str = "tiny", *, progress: Callable[[str], None] = lambda msg: None, skip_existing: bool = True
) -> list[str]:
    """Build one pair (and for `tiny` also the incompatible draft) into `root`; return names."""
    spec = PAIRS[pair]
    root.mkdir(parents=True, exist_ok=True)
    names = spec.names() + ([ALIEN_NAME] if pair == "tiny" else [])
    if skip_existing and all(_manifest(root, name).exists() for name in names):
        return names
    vocab = build_vocabulary(spec.vocab_size, spec.n_merges)
    progress(f"generating weights for {spec.target_name} ({spec.description})")

    def made(done: int, total: int) -> None:
        progress(f"generating {spec.target_name}'s weights: layer {done} of {total}")

    weights = make_weights(spec.arch, vocab.size, spec.recipe, spec.draft_layers, layer_done=made)
    dtype = spec.recipe.dtype
    models = [(spec.target_name, spec.arch.n_layer, dtype), (spec.draft_name, spec.draft_layers, dtype)]
    models += [(f"{name}:{q.lower()}", n_layer, q) for q in spec.quantized for name, n_layer, _ in models[:2]]
    for name, n_layer, dtype in models:
        progress(f"writing {name}: {n_layer} layers, {dtype}")

        def written(done: int, total: int, name: str = name, dtype: str = dtype) -> None:
            progress(f"writing {name}: layer {done} of {total}, {dtype}")  # on a terminal, in place of the last

        with tempfile.TemporaryDirectory(dir=root, prefix=".staging-") as tmp:
            path = Path(tmp) / "model.gguf"
            write_gguf(
                path,
                name=name,
                arch=spec.arch,
                n_layer=n_layer,
                vocab=vocab,
                weights=weights,
                dtype=dtype,
                layer_done=written,
            )
            write_model(root, name, path)  # its sha256: a second or two for the 0.6B target
    if pair == "tiny":
        alien_vocab = build_vocabulary(*ALIEN_VOCAB)
        alien_weights = make_weights(spec.arch, alien_vocab.size, _recipe(3, *ALIEN_VOCAB), 1)
        with tempfile.TemporaryDirectory(dir=root, prefix=".staging-") as tmp:
            path = Path(tmp) / "model.gguf"
            write_gguf(
                path, name=ALIEN_NAME, arch=spec.arch, n_layer=1, vocab=alien_vocab, weights=alien_weights, dtype="F32"
            )
            write_model(root, ALIEN_NAME, path)
    return names


def build_demo_store(
    root: Path, *, include_bench: bool = True, progress: Callable[[str], None] = lambda m: None
) -> list[str]:
    names = build_pair_store(root, "tiny", progress=progress)
    if include_bench:
        names += build_pair_store(root, "bench", progress=progress)
    return names


def _manifest(root: Path, name: str) -> Path:
    return root / "manifests" / Path(*parse_model_name(name).manifest_parts)
