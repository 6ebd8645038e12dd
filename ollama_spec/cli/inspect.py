"""Commands that read the store: list, show, pair, demo-store."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ollama_spec.cli.common import Notes, echo_json, open_store
from ollama_spec.cli.options import json_option, models_dir_option
from ollama_spec.errors import IncompatibleDraft, OllamaSpecError, one_line
from ollama_spec.llama.backends import llama_cpp_knows
from ollama_spec.models.blobs import verify_blob
from ollama_spec.models.compat import check_compatibility, llama3_metadata_fixes
from ollama_spec.models.drafts import size_note
from ollama_spec.models.gguf_info import ModelInfo, format_bytes, read_model_info
from ollama_spec.models.heads import HeadFacts, head_facts
from ollama_spec.models.resolve import gguf_file, lora_adapter, resolve_model
from ollama_spec.models.store import BrokenModel, StoredModel, blob_path
from ollama_spec.models.usable import require_usable, usability_problems


@click.command("list")
@models_dir_option
@json_option
def list_models(models_dir: str | None, as_json: bool) -> None:
    """List every model in the Ollama store, with its GGUF facts.

    \b
    Examples:
      ollama-spec list
      OLLAMA_MODELS=/data/ollama ollama-spec list --json
    """
    store = open_store(models_dir)
    rows = []
    for model in store.models():
        rows.append(_list_row(model))
    if as_json:
        echo_json({"store": str(store.path), "store_source": store.root.source, "models": rows})
        return
    click.echo(f"store: {store.path} (from {store.root.source})", err=True)
    if not rows:
        click.echo("no models in this store; pull one with 'ollama-spec pull llama3.2:1b'", err=True)
        return
    header = ("NAME", "SIZE", "ARCH", "PARAMS", "QUANT")
    table = [header] + [
        (
            r["name"],
            format_bytes(r["size"]) if r["size"] is not None else "?",
            r.get("architecture") or "-",
            r.get("parameters") or "-",
            r.get("file_type") or r.get("error", "-"),
        )
        for r in rows
    ]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(header) - 1)]
    for row in table:
        click.echo("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)) + "  " + str(row[-1]))


def _list_row(model: StoredModel | BrokenModel) -> dict:
    name = one_line(model.name)
    if isinstance(model, BrokenModel):
        return {"name": name, "size": None, "error": _problem(model.name, model.error)}
    row = {"name": name, "size": model.size}
    try:
        info = model.model_info(read_vocab=False)
    except OllamaSpecError as exc:
        row["error"] = _problem(model.name, exc)
        return row
    row |= {
        "architecture": info.architecture,
        "parameters": info.parameter_label,
        "parameter_count": info.parameter_count,
        "file_type": info.file_type,
    }
    return row


def _problem(name: str, error: OllamaSpecError) -> str:
    """The error without the model's name in front: the row already shows it."""
    return one_line(str(error).removeprefix(f"{name}: "))


@click.command()
@click.argument("model")
@models_dir_option
@json_option
@click.option("--verify", is_flag=True, help="Also check every blob's sha256 (reads the whole model).")
def show(model: str, models_dir: str | None, as_json: bool, verify: bool) -> None:
    """Show a model's blob, manifest layers and GGUF header.

    Reads only the GGUF header: instant even for a 40 GB model (unless --verify).

    \b
    Examples:
      ollama-spec show llama3.1:70b
      ollama-spec show hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M --json
      ollama-spec show llama3.2:1b --verify
    """
    path = gguf_file(model)
    if path is not None:  # a loose .gguf file: no manifest, just the header
        _show_file(read_model_info(path), as_json)
        return
    stored = open_store(models_dir).resolve(model)
    info = stored.model_info()
    if verify:
        _verify_layers(stored)
    fixes = llama3_metadata_fixes(info)
    notes = _layer_notes(stored, info)
    if as_json:
        echo_json(
            {
                "name": stored.name,
                "manifest": str(stored.manifest_path),
                "blob": str(info.path),
                "layers": [{"type": l.kind, "digest": l.digest, "size": l.size} for l in stored.layers],
                "gguf": info.summary(),
                "load_fixes": [f.description for f in fixes],
                "notes": notes,
                "verified": verify,
            }
        )
        return
    click.echo(one_line(stored.name))
    click.echo(f"  manifest      {one_line(str(stored.manifest_path))}")
    click.echo(f"  blob          {one_line(str(info.path))}")
    click.echo("  layers")
    for layer in stored.layers:
        click.echo(f"    {one_line(layer.kind):<10} {format_bytes(layer.size):>10}  {layer.digest}")
    _echo_gguf(info)
    for fix in fixes:
        click.echo(f"  load fix: {one_line(fix.description)}")
    for note in notes:
        click.echo(f"  note: {one_line(note)}")
    if verify:
        click.echo("  sha256 verified for every layer and the config")


def _layer_notes(stored: StoredModel, info: ModelInfo) -> list[str]:
    """What ollama-spec does differently from Ollama with this manifest's layers."""
    notes = []
    for layer in stored.layers:
        if layer.kind == "adapter":
            try:
                lora_adapter(blob_path(stored.root, layer.digest), info, "the adapter")
                notes.append("a LoRA adapter layer: applied over the weights, as Ollama applies it")
            except OllamaSpecError as exc:
                notes.append(
                    f"a LoRA adapter layer that cannot be applied ({exc}): generate, chat and serve refuse the model"
                )
    if stored.layer("projector") is not None:
        notes.append("a vision projector layer: images are not read, text works as usual")
    if stored.layer("draft") is not None:
        notes.append("a draft layer: used as the draft when no --draft is given")
    if (stored.layer("template") or stored.layer("prompt")) is not None and not _has_chat_template(stored):
        notes.append(
            "no chat template in the GGUF, and Ollama's (Go) template layer is not supported: prompts go unformatted"
        )
    if problems := usability_problems(info, llama_cpp_knows):
        notes.append("generate, chat and serve refuse it: it has " + ", ".join(problems))
    if problem := stored.config_problem():
        notes.append(f"Ollama cannot load it: {problem}")
    return notes


def _has_chat_template(stored: StoredModel) -> bool:
    try:
        return bool(stored.model_info(read_vocab=False).chat_template)
    except OllamaSpecError:
        return True  # nothing to add to the error the model's own line gives


def _show_file(info, as_json: bool) -> None:
    fixes = llama3_metadata_fixes(info)
    if as_json:
        echo_json(
            {
                "name": info.path.name,
                "blob": str(info.path),
                "layers": [],
                "gguf": info.summary(),
                "load_fixes": [f.description for f in fixes],
                "verified": False,
            }
        )
        return
    click.echo(one_line(info.path.name))
    click.echo(f"  file          {one_line(str(info.path))}")
    _echo_gguf(info)
    for fix in fixes:
        click.echo(f"  load fix: {fix.description}")


def _echo_gguf(info) -> None:
    s = info.summary()
    click.echo("  gguf")
    for key in (
        "architecture",
        "name",
        "parameters",
        "file_type",
        "context_length",
        "block_count",
        "embedding_length",
        "feed_forward_length",
        "head_count",
        "head_count_kv",
        "head_dim",
        "sliding_window",
        "vocab_type",
        "pre_tokenizer",
        "vocab_size",
        "bos_token_id",
        "eos_token_id",
        "eot_token_id",
        "add_bos_token",
        "add_eos_token",
        "has_chat_template",
        "tensor_count",
    ):
        if key == "sliding_window" and s[key] is None:  # only models that have one
            continue
        # strings from the file may hold terminal escapes or line breaks: shown escaped, as errors are
        click.echo(f"    {key:<20} {one_line(str(s[key]))}")
        if s.get(f"{key}_per_layer"):  # layers differ (DeciLM, LFM2, hybrids)
            click.echo(f"    {'  per layer':<20} {one_line(str(s[f'{key}_per_layer']))}")
    click.echo(f"    {'tensor_bytes':<20} {format_bytes(info.tensor_bytes)}")


def _verify_layers(stored: StoredModel) -> None:
    # the config too: Ollama's pull verifies it, and Ollama cannot load a model without it
    layers = [*stored.layers, *([stored.config_layer] if stored.config_layer else [])]
    if not sys.stderr.isatty():  # no progress bar to draw: its label alone would be a stray line
        for layer in layers:
            verify_blob(blob_path(stored.root, layer.digest), layer)
        return
    with click.progressbar(
        length=sum(layer.size for layer in layers), label="verifying sha256", file=sys.stderr
    ) as bar:
        for layer in layers:
            verify_blob(blob_path(stored.root, layer.digest), layer, progress=bar.update)


@click.command()
@click.argument("target")
@click.argument("draft")
@models_dir_option
@json_option
def pair(target: str, draft: str, models_dir: str | None, as_json: bool) -> None:
    """Check that DRAFT can speculate for TARGET (same vocabulary rules as llama.cpp).

    DRAFT may be an EAGLE-3 head: then it also says which target layers the head reads, and refuses a
    head made for another width, layer count or vocabulary. Exits 0 when the pair is usable, 1 with the
    reason when it is not.

    \b
    Examples:
      ollama-spec pair llama3.1:70b llama3.2:1b
      ollama-spec pair qwen2.5:32b qwen2.5:0.5b --json
    """
    target_model, draft_model = resolve_model(target, models_dir), resolve_model(draft, models_dir)
    target, draft = target_model.name, draft_model.name  # as stored: `TINY-TARGET` reads tiny-target:latest
    target_info, draft_info = target_model.info, draft_model.info
    require_usable(target, target_info, "target", llama_cpp_knows)
    require_usable(draft, draft_info, "draft", llama_cpp_knows)
    if _same_file(target_info.path, draft_info.path):
        click.echo(
            f"warning: {draft} and {target} are the same model (one blob): a model drafting for itself only adds work",
            err=True,
        )
    verdict = check_compatibility(target_info, draft_info)
    head = head_facts(draft_info)
    fixes = [
        f"{name}: {fix.description}"
        for name, info in ((target, target_info), (draft, draft_info))
        for fix in llama3_metadata_fixes(info)
    ]
    if as_json:
        echo_json(
            {
                "target": target,
                "draft": draft,
                "compatible": verdict.ok,
                "problems": list(verdict.problems),
                "eagle3_head": _head_json(head),
                "load_fixes": fixes,
            }
        )
        if not verdict.ok:
            raise SystemExit(1)
        return
    if not verdict.ok:
        raise IncompatibleDraft(f"{draft} cannot draft for {target}: " + "; ".join(verdict.problems))
    click.echo(
        f"{draft} can draft for {target}: same {target_info.vocab_type} vocabulary "
        f"({target_info.vocab_size} vs {draft_info.vocab_size} tokens), same BOS/EOS"
    )
    if head is not None:
        click.echo(f"{draft} is an EAGLE-3 head made for {target}'s shape: it {head.describe()}")
    else:
        click.echo(_size_line(target_info.tensor_bytes / max(draft_info.tensor_bytes, 1)))
    for fix in fixes:
        click.echo(f"load fix: {fix}")


def _head_json(head: HeadFacts | None) -> dict | None:
    if head is None:
        return None
    return {
        "target_layers": list(head.target_layers) if head.target_layers is not None else None,
        "target_hidden_size": head.target_hidden_size,
        "draft_vocab_size": head.draft_vocab_size,
        "d2t": head.has_d2t,
    }


def _size_line(ratio: float) -> str:
    """The draft's size next to the target's, with `drafts`' verdict on it."""
    if ratio >= 1.005:
        size = f"draft weights are {ratio:.1f}x smaller than the target's"
    elif ratio > 0.995:
        size = "draft weights are as large as the target's"
    else:
        size = f"draft weights are {1 / ratio:.1f}x LARGER than the target's"
    note = size_note(ratio)
    return f"{size} ({note})" if note else size


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False


@click.command("demo-store")
@click.argument("directory", type=click.Path(file_okay=False), default=None, required=False)
@click.option("--tiny-only", is_flag=True, help="Only the tiny test pair (skip the 0.6B benchmark pair).")
@click.option(
    "--nested",
    type=click.Choice(["8b-1b", "tiny", "tiny-128k"]),
    default=None,
    help="Instead: a pair with real shapes and quantizations (8b-1b: Llama-3.1-8B-shaped Q4_K_M target, "
    "Llama-3.2-1B-shaped Q8_0 draft, 6.5 GB; tiny: the same at toy size), for GPU benchmarks; tiny-128k: "
    "the toy size with Llama 3's vocabulary, where no K pays.",
)
def demo_store(directory: str | None, tiny_only: bool, nested: str | None) -> None:
    """Build the synthetic demo models into an Ollama-layout store at DIRECTORY.

    Models: tiny-target, tiny-draft, their Q8_0 and Q4_0 versions (tiny-target:q8_0, ...),
    tiny-alien (incompatible vocabulary) and, unless
    --tiny-only, synth-target (0.6B parameters, F16) with synth-draft. Deterministic; models
    that already exist are kept.

    \b
    Examples:
      ollama-spec demo-store ./demo-models
      OLLAMA_MODELS=./demo-models ollama-spec list
      ollama-spec demo-store ./gpu-models --nested 8b-1b
    """
    from ollama_spec.synthetic import build_demo_store

    root = Path(directory or "demo-models")
    if nested:
        from ollama_spec.synthetic.nested import build_nested_store

        names = build_nested_store(root, nested, progress=Notes(prefix=""))
        click.echo(f"demo store ready at {root}: {', '.join(names)}")
        return
    # each layer's progress: in place on a terminal, a line every few seconds in a log
    names = build_demo_store(root, include_bench=not tiny_only, progress=Notes(prefix=""))
    click.echo(f"demo store ready at {root}: {', '.join(names)}")
