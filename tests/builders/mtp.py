"""A target that carries one MTP (NextN) layer (synthetic/mtp_target.py), in a store beside the tiny pair: its
tokenizer is tiny-target's, so tiny-draft can draft for it too."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ollama_spec.models.resolve import resolve_model
from ollama_spec.synthetic.layout import write_model
from ollama_spec.synthetic.mtp_target import MtpShape, write_mtp_target

MTP_NAME = "mtp-target"


def build_mtp_target(root: Path, name: str = MTP_NAME, shape: MtpShape | None = None) -> str:
    """Write the MTP target into the store at `root` (which holds tiny-target); return its name."""
    tokenizer = resolve_model("tiny-target", str(root)).path
    with tempfile.TemporaryDirectory(dir=root, prefix=".staging-") as tmp:
        path = write_mtp_target(Path(tmp) / "model.gguf", tokenizer, shape or MtpShape())
        write_model(root, name, path)
    return name
