"""Variants of the tiny store's models for tests: tiny-target's manifest under another name, with layers
added or taken away, as Ollama's Modelfile directives (ADAPTER, DRAFT, MESSAGE, ...) would write them."""

import json

from ollama_spec.models.manifest import MEDIA_TYPE_PREFIX
from ollama_spec.synthetic.catalog import PAIRS
from ollama_spec.synthetic.layout import add_blob
from tests.builders.writers import write_lora_gguf

LIBRARY = ("manifests", "registry.ollama.ai", "library")


def variant(root, name, base="tiny-target", extra=(), keep=lambda layer: True):
    """`base`'s manifest under `name`, with its layers filtered by `keep` and `extra` added: (kind, content), the
    content being bytes, a blob's (digest, size), or a model name whose model blob to use."""
    doc = json.loads(root.joinpath(*LIBRARY, base, "latest").read_text())
    layers = [layer for layer in doc["layers"] if keep(layer)]
    for kind, content in extra:
        if isinstance(content, bytes):
            digest, size = add_blob(root, content)
        elif isinstance(content, tuple):  # a blob already added: (digest, size)
            digest, size = content
        else:
            source = json.loads(root.joinpath(*LIBRARY, content, "latest").read_text())["layers"][0]
            digest, size = source["digest"], source["size"]
        layers.append({"mediaType": MEDIA_TYPE_PREFIX + kind, "digest": digest, "size": size})
    path = root.joinpath(*LIBRARY, name, "latest")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc | {"layers": layers}))


def without_chat_template(root, name, base="tiny-target"):
    """`base` under `name` with a GGUF whose tokenizer.chat_template key is renamed (same length: the file stays
    valid), so only the manifest's Ollama (Go) template layer is left."""
    doc = json.loads(root.joinpath(*LIBRARY, base, "latest").read_text())
    model = doc["layers"][0]
    data = root.joinpath("blobs", model["digest"].replace(":", "-")).read_bytes()
    assert data.count(b"tokenizer.chat_template") == 1
    digest, size = add_blob(root, data.replace(b"tokenizer.chat_template", b"tokenizer.chat_templatX"))
    variant(
        root, name, base=base, keep=lambda layer: layer["digest"] != model["digest"], extra=[("model", (digest, size))]
    )


def lora_variant(root, name, scratch, base="tiny-target", **lora):
    """`base` with an adapter layer: a LoRA for the tiny pair's target, written in `scratch` (write_lora_gguf's
    keyword arguments change it); returns the adapter file."""
    spec = PAIRS["tiny"]
    path = scratch / f"{name}-lora.gguf"
    write_lora_gguf(path, **({"arch": spec.arch, "n_layer": spec.arch.n_layer} | lora))
    variant(root, name, base=base, extra=[("adapter", path.read_bytes())])
    return path


def inconsistencies(root) -> list[str]:
    """What is wrong with a store: each manifest's layers and config whose blob is missing or whose sha256
    differs from its digest. Manifests that are not JSON name nothing (as Ollama reads them)."""
    import hashlib
    from pathlib import Path

    from ollama_spec.pull.writer import named_blobs

    root, found = Path(root), []
    for manifest in sorted(p for p in (root / "manifests").rglob("*") if p.is_file()):
        for blob in named_blobs(manifest.read_bytes()):
            path = root / "blobs" / blob.digest.replace(":", "-")
            if not path.is_file():
                found.append(f"{manifest.relative_to(root)} names {blob.digest}, which is missing")
            elif hashlib.sha256(path.read_bytes()).hexdigest() != blob.hex:
                found.append(f"{manifest.relative_to(root)} names {blob.digest}, whose file has another sha256")
    return found
