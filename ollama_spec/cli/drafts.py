"""`ollama-spec drafts`: the store's models that can draft for a target, and which one `auto` picks."""

from __future__ import annotations

import click

from ollama_spec.cli.common import echo_json, open_store
from ollama_spec.cli.options import json_option, models_dir_option
from ollama_spec.cli.targets import mtp_note
from ollama_spec.engine.pairing import mtp_problem
from ollama_spec.llama.backends import llama_cpp_knows
from ollama_spec.models.drafts import USEFUL_RATIO, DraftCandidate, best_draft, find_drafts
from ollama_spec.models.gguf_info import format_bytes
from ollama_spec.models.resolve import ResolvedModel, resolve_model


@click.command()
@click.argument("target")
@json_option
@models_dir_option
def drafts(target: str, as_json: bool, models_dir: str | None) -> None:
    """List the models in the store that can draft for TARGET, smallest first.

    A draft must share TARGET's vocabulary (llama.cpp's rules). Each row gives the size ratio
    (target file : draft file); about 1:20 to 1:50 is the useful range, and a draft over a tenth
    of the target's size rarely pays. `--draft auto` on generate, chat, bench, check and serve
    takes the row marked "auto", or, when TARGET's manifest carries a draft layer (Ollama's DRAFT), that draft.
    An EAGLE-3 head made for TARGET (ollama-spec pull <head> --head-for TARGET) is listed with the target
    layers it reads, and auto takes it before any draft model. A TARGET that carries its own MTP (NextN)
    layers (GLM-4.x, DeepSeek V3) drafts with them (--draft mtp), and auto, or no --draft, takes them before
    the store's drafts where they pay.

    \b
    Examples:
      ollama-spec drafts llama3.1:70b
      ollama-spec drafts qwen2.5-coder:32b --json
    """
    store = open_store(models_dir)
    target_model = resolve_model(target, store=store)
    candidates = find_drafts(store, target_model.info, llama_cpp_knows)
    # the draft the target's manifest carries (Ollama's DRAFT) is what auto, and no --draft, take
    stored = target_model.stored_draft is not None
    mtp = not stored and bool(target_model.info.nextn_layers) and mtp_problem(target_model) is None
    best = None if stored or mtp else best_draft(candidates)
    if as_json:
        mtp_json = {"nextn_layers": target_model.info.nextn_layers, "mtp": mtp}
        echo_json(_drafts_json(target_model, stored, candidates, best) | mtp_json)
        return
    if stored:
        click.echo(f"auto: the draft stored in {target_model.name}'s manifest (also used without --draft)", err=True)
    _mtp_lines(target_model, mtp)
    if not candidates:
        click.echo(
            f"no model in {store.path} can draft for {target_model.name}; pull a small model of the same "
            "family (e.g. llama3.2:1b for Llama 3, qwen2.5:0.5b for Qwen2.5), or use --draft ngram",
            err=True,
        )
        return
    _print_table(target_model, candidates, best)


def _mtp_lines(target: ResolvedModel, auto: bool) -> None:
    """On stderr: the MTP layers the target carries (`auto`: what auto takes), and why they cannot draft."""
    if target.info.nextn_layers:
        click.echo(f"{'auto' if auto else 'note'}: {mtp_note(target.info)}", err=True)
        if (problem := mtp_problem(target)) is not None:
            click.echo(f"  but {problem}", err=True)


def _drafts_json(
    target: ResolvedModel, stored: bool, candidates: list[DraftCandidate], best: DraftCandidate | None
) -> dict:
    return {
        "target": target.name,
        "size": target.info.file_size,
        "stored_draft": stored,
        "drafts": [
            {
                "model": c.name,
                "size": c.info.file_size,
                "parameters": c.info.parameter_label,
                "ratio": round(c.ratio, 2),
                "note": c.note,
                "eagle3_head": c.is_head,
                "auto": c is best,
            }
            for c in candidates
        ],
    }


def _print_table(target: ResolvedModel, candidates: list[DraftCandidate], best: DraftCandidate | None) -> None:
    """The drafts, one a line, the one auto takes marked."""
    low, high = USEFUL_RATIO
    click.echo(
        f"drafts for {target.name} ({format_bytes(target.info.file_size)}); "
        f"useful range about 1:{low:.0f} to 1:{high:.0f}"
    )
    width = max(len(c.name) for c in candidates)
    for c in candidates:
        mark = "auto" if c is best else "    "
        note = f"  {c.note}" if c.note else ""
        click.echo(
            f"{mark} {c.name:<{width}}  {c.info.parameter_label:>6}  {format_bytes(c.info.file_size):>10}  "
            f"1:{c.ratio:<5.1f}{note}"
        )
