"""`check`: will the target and draft fit in memory, and what to change if not."""

from __future__ import annotations

import click

from ollama_spec.cli.common import echo_json
from ollama_spec.cli.options import (
    WITHOUT_DRAFT,
    ctx_option,
    draft_option,
    flash_attn_option,
    json_option,
    kv_type_option,
    models_dir_option,
    parallel_option_with,
    placement_options,
    preset_option,
    repack_option,
)
from ollama_spec.cli.settings import Options, placement_settings, repack_setting
from ollama_spec.cli.targets import apply_preset, mtp_note, resolve_draft
from ollama_spec.engine.engine import DEFAULT_CTX
from ollama_spec.engine.flash_choice import cached_choice
from ollama_spec.engine.pairing import DraftChoice
from ollama_spec.llama import backends
from ollama_spec.llama.backends import llama_cpp_knows
from ollama_spec.llama.load_params import MEASURE, choose_flash_attention
from ollama_spec.llama.model import LoadSettings
from ollama_spec.llama.rpc import remote_devices
from ollama_spec.models.compat import require_compatible
from ollama_spec.models.daemon import daemon_status, freeing_advice
from ollama_spec.models.gguf_info import ModelInfo, format_bytes
from ollama_spec.models.heads import HeadFacts, head_facts
from ollama_spec.models.resolve import ResolvedModel, resolve_model
from ollama_spec.models.usable import require_usable
from ollama_spec.planning.memory import FULL_OFFLOAD, MemoryPlan, plan_memory
from ollama_spec.planning.needs import ModelNeeds
from ollama_spec.planning.placement import Placement


@click.command()
@click.argument("target")
@preset_option
@draft_option(f"Its memory is planned beside TARGET's. {WITHOUT_DRAFT}", names="a name or a .gguf path")
@ctx_option
@kv_type_option
@repack_option
@flash_attn_option
@placement_options
@parallel_option_with("Plan for N slots, as serve --parallel N runs them: N times the KV cache.", default=1)
@json_option
@models_dir_option
@click.pass_context
def check(
    context: click.Context,
    target: str,
    preset,
    draft: str | None,
    ctx: int | None,
    kv_type: str,
    repack: bool | None,
    flash_attn: str,
    rpc: str | None,
    tensor_split: str | None,
    split_mode: str | None,
    main_gpu: int | None,
    parallel: int,
    as_json: bool,
    models_dir: str | None,
) -> None:  # the placement options go to placement_settings with where each came from
    """Check that TARGET (and --draft) fit in GPU memory before loading anything.

    Reads only GGUF headers: weights, KV cache and compute buffers per model, the free memory of
    each GPU (NVIDIA, Apple) or of the CPU RAM, and a verdict: fits with full offload, fits only
    with some target layers on the GPU (the draft stays fully on it), or does not fit, with what
    to change. Exits 0 when it fits, 1 when it does not; a draft that cannot draft for TARGET
    (llama.cpp's vocabulary rules) is an error.

    \b
    Examples:
      ollama-spec check llama3.1:70b --draft llama3.2:1b
      ollama-spec check llama3.1:70b -d llama3.2:1b --ctx 32768 --kv-type q8_0
      ollama-spec check qwen2.5:32b -d qwen2.5:0.5b --json
      ollama-spec check -f llama3.1-70b
      ollama-spec check llama3.1:8b -d llama3.2:1b --ctx 8192 --parallel 4   # what serve's 4 slots need
      ollama-spec check llama3.1:70b -d llama3.2:1b --rpc 192.168.1.20:50052   # with a second machine's GPU
    """
    target_model = apply_preset(resolve_model(target, models_dir), preset)
    choice = resolve_draft(draft, models_dir, target_model)
    draft_model = choice.model
    head = _checked_pair(target_model, draft_model, as_json)
    n_ctx = ctx if ctx is not None else int(target_model.params.get("num_ctx") or DEFAULT_CTX)
    _draft_notes(target_model, choice, as_json)
    decision = repack_setting(repack)
    placement = placement_settings(Options.of(context))
    flash_note = _flash_note(target_model, flash_attn, kv_type, decision.enabled, placement, parallel, n_ctx)
    if flash_note and not as_json:
        click.echo(f"note: flash attention {flash_note}", err=True)
    flash_attention = None if flash_attn == "auto" else flash_attn == "on"
    facts = (decision.enabled, flash_attention, placement, parallel, choice.mtp)
    plan = _plan(target_model, draft_model, n_ctx, kv_type, *facts)
    for warning in plan.warnings:
        click.echo(f"warning: {warning}", err=True)
    # A GPU short of memory is often Ollama's own doing: it keeps models loaded after use.
    daemon = daemon_status() if plan.gpus and plan.verdict != FULL_OFFLOAD else None
    if as_json:
        data = _plan_json(plan, daemon, decision, target_model, draft_model, head) | _mtp_json(target_model, choice)
        echo_json(data | ({"flash_attention_note": flash_note} if flash_note else {}))
    else:
        models = [(m.name, m.info) for m in (target_model, draft_model) if m is not None]
        click.echo("\n".join(render_plan(plan, models) + (freeing_advice(daemon) if daemon else [])))
    if not plan.fits:
        raise SystemExit(1)


def _flash_note(
    target: ResolvedModel, asked: str, kv_type: str, repack: bool, placement: Placement, slots: int, n_ctx: int
) -> str | None:
    """Where flash attention is timed at the first load (several slots on a CPU): the kind timed before for
    this setup, or that it will be timed; None elsewhere."""
    if choose_flash_attention(asked, kv_type, n_seq=slots) != MEASURE:
        return None
    settings = LoadSettings(
        n_ctx=n_ctx,
        kv_type=kv_type,
        use_extra_bufts=repack,
        placement=placement,
        lora_adapters=target.adapter_paths,
        n_seq=slots,
    )
    cached = cached_choice(target.path, settings)
    if cached is not None:
        return f"{cached} for {slots} slots"
    return f"is timed on and off at the first load with {slots} slots, and off where it is slower (then cached)"


def _plan_json(plan: MemoryPlan, daemon, decision, target: ResolvedModel, draft: ResolvedModel | None, head) -> dict:
    """--json's object: the plan, the daemon's models where it holds GPU memory, the repack decision, the names."""
    data = plan.to_json()
    if daemon is not None:
        data["ollama_daemon"] = daemon.to_json()
    data["repack_decision"] = decision.to_json()
    data["target"]["model"] = target.name
    if draft:
        data["draft"]["model"] = draft.name
    if head is not None:
        data["draft"]["eagle3_target_layers"] = list(head.target_layers or ())
    return data


def _draft_notes(target: ResolvedModel, choice: DraftChoice, as_json: bool) -> None:
    """On stderr: the target's MTP layers, where it carries them, and a draftless source's plan."""
    if target.info.nextn_layers and not as_json:
        planned = "the plan counts them and their cache" if choice.mtp else "not planned: another draft is chosen"
        click.echo(f"note: {mtp_note(target.info)}; {planned}", err=True)
    if choice.source is not None and not choice.mtp:
        click.echo(f"note: --draft {choice.source} loads no draft model: the plan is for the target alone", err=True)


def _mtp_json(target: ResolvedModel, choice: DraftChoice) -> dict:
    """--json's account of the target's MTP layers: how many it carries, whether the plan counts them."""
    return {"mtp": {"nextn_layers": target.info.nextn_layers, "planned": choice.mtp}}


def _checked_pair(target: ResolvedModel, draft: ResolvedModel | None, as_json: bool) -> HeadFacts | None:
    """Refuse a model llama.cpp cannot run or a draft that cannot draft for the target; an EAGLE-3 head's
    facts (said on stderr)."""
    for role, model in (("target", target), ("draft", draft)):
        if model is not None:
            require_usable(model.name, model.info, role, llama_cpp_knows)
    head = head_facts(draft.info) if draft is not None else None
    if draft is not None:
        require_compatible(target.name, target.info, draft.name, draft.info)
    if head is not None and not as_json:
        click.echo(f"note: {draft.name} is an EAGLE-3 head: it {head.describe()}", err=True)
    return head


def _plan(
    target: ResolvedModel,
    draft: ResolvedModel | None,
    n_ctx: int,
    kv_type: str,
    repack: bool,
    flash_attention: bool | None,
    placement: Placement,
    parallel: int,
    mtp: bool = False,
) -> MemoryPlan:
    """The pair's memory plan on this machine's devices (and the RPC servers'); `mtp`: with the target's MTP
    layers drafting."""
    devices, notes = backends.discover_devices()
    return plan_memory(
        target.loaded_info,
        draft.loaded_info if draft else None,
        n_ctx,
        kv_type,
        devices,
        notes=notes,
        features=backends.cpu_features(),
        repack=repack,
        flash_attention=flash_attention,
        tensor_split=placement.tensor_split,
        remote=remote_devices(placement.rpc_servers),
        main_device=placement.main_device,
        n_seq=parallel,
        mtp=mtp,
    )


def render_plan(plan: MemoryPlan, models: list[tuple[str, ModelInfo]]) -> list[str]:
    """The human-readable report: per model, totals, devices, verdict, suggestions."""
    lines = []
    for role, (name, info), needs in zip(("target", "draft"), models, (plan.target, plan.draft)):
        layers = f"{needs.n_layer} layer{'s' if needs.n_layer != 1 else ''}"
        lines.append(
            f"{role:<7} {name}  ({info.parameter_label} {info.file_type}, {layers}, "
            f"trained context {info.context_length or '?'})"
        )
        # the draft never goes to an RPC server: without a GPU here it runs in this machine's RAM
        where = ("GPU" if plan.local_gpus else None) if role == "draft" else (plan.offload_word if plan.gpus else None)
        lines += _model_lines(plan, needs, where)
    if plan.draft is not None and plan.remote_devices:
        where = "on this machine's GPUs" if plan.local_gpus else "in this machine's RAM"
        lines.append(
            f"the target's layers go to the RPC servers{' and the GPUs' if plan.local_gpus else ''}; "
            f"the draft stays {where}"
        )
    elif plan.draft is not None:
        both = plan.target.gpu_total + plan.draft.gpu_total
        lines.append(
            f"both on the GPU {format_bytes(both):>12}"
            if plan.gpus
            else f"both in RAM {format_bytes(plan.target.cpu_total + plan.draft.cpu_total):>16}"
        )
    lines.append("devices")
    # several offload devices: each one's share of the target and the bytes planned on it
    # (--tensor-split's shares are relative, as llama.cpp reads them: 3,1 is 75% and 25%)
    total = sum(plan.tensor_split)
    shares = dict(zip(plan.gpus, zip((s / total for s in plan.tensor_split), plan.device_bytes))) if total else {}
    for device in plan.devices:
        kept = f", {format_bytes(device.reserve)} kept for the driver" if device.reserve else ""
        planned = (
            f"; {shares[device][0]:.0%} of the target, {format_bytes(shares[device][1])} planned"
            if device in shares
            else ""
        )
        lines.append(
            f"  {device.name:<28} {format_bytes(device.free):>10} free of {format_bytes(device.total)}{kept}{planned}"
        )
    if plan.host_repacked and plan.gpus:  # CPU-only plans show it per model
        lines.append(
            f"repacked: {format_bytes(plan.host_repacked)} in RAM counted for llama.cpp's repacked copy of "
            "the CPU weights (this CPU has kernels for their types; --no-repack skips it)"
        )
    lines.append(f"verdict: {plan.summary}")
    lines += [f"  try: {suggestion}" for suggestion in plan.suggestions]
    return lines


def _cache_line(plan: MemoryPlan, needs: ModelNeeds) -> str:
    if needs.recurrent and needs.recurrent == needs.kv:  # Mamba, RWKV: no per-token cache at all
        return f"  state    {format_bytes(needs.kv):>12}  (recurrent, the same at any context)"
    state = f"; {format_bytes(needs.recurrent)} of it recurrent state" if needs.recurrent else ""
    window = f"; window layers keep {needs.window_cells:,} tokens" if needs.window_cells else ""
    tokens = f"{plan.n_seq} slots x {plan.n_ctx // plan.n_seq}" if plan.n_seq > 1 else f"{plan.n_ctx}"
    return f"  KV cache {format_bytes(needs.kv):>12}  ({tokens} tokens, {plan.kv_type}{state}{window})"


def _model_lines(plan: MemoryPlan, needs: ModelNeeds, where: str | None) -> list[str]:
    """One model's needs; `where` it is offloaded to ("GPU", "RPC servers"), None: all in RAM."""
    if where is None:
        why = "(llama.cpp's copy for this CPU's kernels; --no-repack skips it)"
        repacked = [f"  repacked {format_bytes(needs.repacked):>12}  {why}"]
        return [
            f"  weights  {format_bytes(needs.file_weights):>12}",
            *(repacked if needs.repacked else []),
            _cache_line(plan, needs),
            f"  compute  {format_bytes(needs.compute):>12}",
            f"  total    {format_bytes(needs.cpu_total):>12}  in RAM",
        ]
    embeddings = f"(+ {format_bytes(needs.host_weights)} token embeddings, kept in RAM)"
    return [
        f"  weights  {format_bytes(needs.weights):>12}  {embeddings}",
        _cache_line(plan, needs),
        f"  compute  {format_bytes(needs.compute):>12}",
        f"  total    {format_bytes(needs.gpu_total):>12}  on the {where} with full offload",
    ]
