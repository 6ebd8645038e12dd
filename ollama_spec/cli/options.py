"""Options shared by several commands, and their mapping onto the core's settings."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click

from ollama_spec.llama.canary import RepackDecision, decide_repack
from ollama_spec.models.drafts import best_draft, find_drafts
from ollama_spec.engine.engine import DEFAULT_CTX, EngineSettings
from ollama_spec.errors import InvalidSetting, ModelNotFound
from ollama_spec.llama.grammar import grammar_for_json
from ollama_spec.models.modelfile import Modelfile, load_modelfile
from ollama_spec.decoding.penalties import DEFAULT_REPEAT_LAST_N, Penalties
from ollama_spec.decoding.penalties import OPTIONS as PENALTY_OPTIONS
from ollama_spec.planning.placement import SPLIT_MODES, Placement, parse_tensor_split
from ollama_spec.decoding.proposers import DEFAULT_NGRAM_SIZE
from ollama_spec.models.resolve import ResolvedModel, lora_adapter, resolve_model, stored_draft_model
from ollama_spec.llama.rpc import parse_endpoints
from ollama_spec.decoding.sampling import DEFAULT_MIN_P, DEFAULT_TEMPERATURE, DEFAULT_TOP_K, DEFAULT_TOP_P, SamplingSettings
from ollama_spec.decoding.loop import DEFAULT_MAX_SPECULATIVE_TOKENS, MAX_NUM_SPECULATIVE_TOKENS, SpeculationSettings
from ollama_spec.models.store import Store, find_store_root
from ollama_spec.prompting.thinking import template_thinks

models_dir_option = click.option(
    "--models-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Ollama model store to read (default: $OLLAMA_MODELS, then ~/.ollama/models, "
    "then /usr/share/ollama/.ollama/models).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
NGRAM = "ngram"  # --draft ngram: draftless prompt lookup instead of a draft model
AUTO = "auto"  # --draft auto: the store's best-sized compatible model (drafts.best_draft)

repack_option = click.option(
    "--repack/--no-repack",
    default=None,
    help="Use llama.cpp's repacked copy of CPU weights (AMX, AVX2, Arm kernels) or not "
    "(default: $OLLAMA_SPEC_REPACK, else on where a one-time test run on this machine passed).",
)


flash_attn_option = click.option(
    "--flash-attn",
    "flash_attn",
    type=click.Choice(["auto", "on", "off"]),
    default="auto",
    show_default=True,
    help="llama.cpp's flash attention. auto: off where the model runs on the CPU (small verify batches are "
    "faster without it deep into a context; it needs more compute memory), llama.cpp's choice on a GPU.",
)


def notice(text: str) -> None:
    """A note on stderr about something that takes a moment (the engine's `notice`)."""
    click.echo(f"note: {text}", err=True)


def decide_repack_for_cli(force: bool | None) -> RepackDecision:
    """The repack decision; says on stderr, once, when a fresh canary run turned repacking off."""
    decision = decide_repack(force)
    if decision.note:
        click.echo(f"note: {decision.note}", err=True)
    return decision


def open_store(models_dir: str | None) -> Store:
    return Store(find_store_root(models_dir))


def echo_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, default=str))


class DraftLength(click.ParamType):
    """`-k`: a positive number of draft tokens, or `auto` (None: chosen each step from measured costs)."""

    name = "N|auto"

    def convert(self, value, param, ctx):
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() == "auto":
            return None
        try:
            return int(value)
        except ValueError:
            self.fail(f"expected a number of draft tokens or 'auto', got {value!r}", param, ctx)


# --- what `generate` and `serve` share: speculation, sampling and loading -------------------------
# Declared once here; `engine_settings` and `sampling_settings` map them onto the core's settings,
# with the model's Ollama params and then Ollama's own defaults filling what a flag leaves unset.


def _stack(*decorators):
    def apply(function):
        for decorator in reversed(decorators):
            function = decorator(function)
        return function

    return apply


# --- -f: a Modelfile preset -----------------------------------------------------------------------
# The file's FROM, DRAFT and speculation parameters become the defaults of the matching options
# (click's default_map), so any flag given still wins; its Ollama parameters and SYSTEM are laid
# over the target's own by `apply_preset`, where the sampling flags then win in the usual way.


def _load_preset(ctx: click.Context, param: click.Parameter, value: str | None) -> Modelfile | None:
    if value is None:
        return None
    preset = load_modelfile(value)
    defaults = {"target": preset.model, "draft": preset.draft, "k": preset.parameters.get("num_speculative_tokens"),
                "draft_p_min": preset.parameters.get("draft_p_min"), "ngram_size": preset.parameters.get("ngram_size")}
    ctx.default_map = {**(ctx.default_map or {}), **{k: v for k, v in defaults.items() if v is not None}}
    return preset


def preset_option_with(help_text: str):
    """-f with a command's own account of which Modelfile lines it uses."""
    return click.option("-f", "--file", "preset", callback=_load_preset, is_eager=True, metavar="MODELFILE",
                        help=help_text)


preset_option = preset_option_with(
    "A Modelfile or a shipped preset's name (e.g. llama3.1-70b): its FROM, DRAFT, PARAMETER and SYSTEM "
    "lines are the defaults, and flags override them."
)


def given(name: str) -> bool:
    """Whether the current command's parameter `name` was given on the command line."""
    return click.get_current_context().get_parameter_source(name) is click.core.ParameterSource.COMMANDLINE


def apply_preset(model: ResolvedModel, preset: Modelfile | None) -> ResolvedModel:
    """The target with the preset's parameters over its own, and the preset's SYSTEM, MESSAGEs and (Jinja) TEMPLATE."""
    if preset is None:
        return model
    info = model.info
    for name in preset.deprecated:
        click.echo(f"note: {preset.path}: PARAMETER {name} is one Ollama no longer takes; ignored, as "
                   "'ollama create' does", err=True)
    if preset.template is not None:
        if "{%" in preset.template or "messages" in preset.template:  # a Hugging Face (Jinja) chat template
            info = dataclasses.replace(info, chat_template=preset.template)
        else:
            click.echo(f"note: {preset.path}: TEMPLATE is an Ollama Go template; the model's own chat template "
                       "is used instead", err=True)
    # As `ollama create` does: the file's MESSAGE lines replace the model's own history, if it has any,
    # and its ADAPTER lines add to the model's own adapters.
    adapters = tuple(lora_adapter(adapter, model.info, f"{preset.path}: ADAPTER {adapter}")
                     for adapter in preset.adapters)
    return dataclasses.replace(model, info=info, params={**model.params, **preset.parameters},
                               system=preset.system if preset.system is not None else model.system,
                               messages=preset.messages or model.messages, adapters=model.adapters + adapters)


speculation_options = _stack(
    click.option(
        "--draft",
        "-d",
        help=f"Draft model (small, same vocabulary), '{AUTO}' for the store's best-sized compatible one, or "
        f"'{NGRAM}' for draftless prompt lookup. Without it: the draft the target's manifest carries (Ollama's "
        "DRAFT layer), else the target alone.",
    ),
    click.option(
        "-k",
        "--num-speculative-tokens",
        "k",
        type=DraftLength(),
        default="auto",
        show_default=True,
        help=f"Tokens the draft proposes per step, at most {MAX_NUM_SPECULATIVE_TOKENS} (default: the model's "
        "draft_num_predict, else auto), or auto: "
        f"token by token, up to {DEFAULT_MAX_SPECULATIVE_TOKENS}, while the draft's confidence and this machine's "
        "measured step costs say the next token pays for itself.",
    ),
    click.option(
        "--draft-p-min",
        type=float,
        default=0.0,
        show_default=True,
        help="Stop drafting early when the draft's most likely next token is less likely than this.",
    ),
    click.option(
        "--ngram-size",
        type=int,
        default=DEFAULT_NGRAM_SIZE,
        show_default=True,
        help=f"With --draft {NGRAM}: the longest n-gram looked up in the text so far.",
    ),
)


def resolve_draft(draft: str | None, models_dir: str | None, target: ResolvedModel) -> ResolvedModel | None:
    """The draft model to load: none for n-gram lookup; without --draft, the draft the target's manifest
    carries (Ollama's DRAFT), if any; `auto` prefers that one, else picks one from the store and says which."""
    if is_ngram(draft):
        return None
    if (not draft or draft.lower() == AUTO) and target.stored_draft is not None:
        click.echo(f"note: drafting with the draft stored in {target.name}'s manifest", err=True)
        return stored_draft_model(target)
    if not draft:
        return None
    if draft.lower() == AUTO:
        store = open_store(models_dir)
        choice = best_draft(find_drafts(store, target.info))
        if choice is None:
            raise ModelNotFound(f"--draft auto: no model in {store.path} can draft for {target.name} "
                                f"(see `ollama-spec drafts {target.name}`); try --draft {NGRAM}")
        note = f"; {choice.note}" if choice.note else ""
        click.echo(f"draft: {choice.name} (auto: 1:{choice.ratio:.0f} of the target's size{note})", err=True)
        return resolve_model(choice.name, store=store)
    return resolve_model(draft, models_dir)


def is_ngram(draft: str | None) -> bool:
    return draft is not None and draft.lower() == NGRAM


def speculation_settings(draft: str | None, params: dict, *, k, draft_p_min, ngram_size) -> SpeculationSettings:
    """The speculation flags: K (None: auto; unset: the model's draft_num_predict; capped, with a note, at
    MAX_NUM_SPECULATIVE_TOKENS), adaptive drafting, and which proposer."""
    source = click.get_current_context().get_parameter_source("k")
    stored_k = params.get("draft_num_predict")
    given_as = "the preset's num_speculative_tokens" if source is click.core.ParameterSource.DEFAULT_MAP else "-k"
    if source is click.core.ParameterSource.DEFAULT and isinstance(stored_k, int) and stored_k > 0:
        k = stored_k  # Ollama's own speculation length for this model; -k or a preset's value wins
        given_as = "the model's draft_num_predict"
    if k is not None and k > MAX_NUM_SPECULATIVE_TOKENS:
        click.echo(f"note: {given_as} {k} is capped to {MAX_NUM_SPECULATIVE_TOKENS} draft tokens per step (one "
                   f"verify batch is at most {MAX_NUM_SPECULATIVE_TOKENS + 1} tokens)", err=True)
        k = MAX_NUM_SPECULATIVE_TOKENS
    return SpeculationSettings(k, draft_p_min, proposer=NGRAM if is_ngram(draft) else "draft", ngram_size=ngram_size)


def _collect_penalty(ctx: click.Context, param: click.Parameter, value):
    ctx.meta.setdefault("penalties", {})[param.name] = value
    return value


def _penalty_option(flag: str, kind: type, text: str):
    # Not passed to each command's function: collected in the click context and read by
    # `sampling_settings`, so every command that samples takes them alike.
    return click.option(flag, type=kind, expose_value=False, callback=_collect_penalty, help=text)


sampling_options = _stack(
    click.option(
        "--temperature", "-t", type=float, help=f"0 = greedy (default: the model's params, else {DEFAULT_TEMPERATURE})."
    ),
    click.option("--top-k", type=int, help=f"0 = off (default: the model's params, else {DEFAULT_TOP_K})."),
    click.option("--top-p", type=float, help=f"1 = off (default: the model's params, else {DEFAULT_TOP_P})."),
    click.option("--min-p", type=float, help=f"0 = off (default: the model's params, else {DEFAULT_MIN_P})."),
    click.option("--seed", type=int, help="Random seed for sampling (default: random)."),
    _penalty_option("--repeat-penalty", float, "Divide the logits of tokens in the last --repeat-last-n by this "
                    "(1 = off; default: the model's params, else 1). Greedy too; output stays the target's."),
    _penalty_option("--repeat-last-n", int, f"The window the penalties look at (-1 = the whole text, 0 = off; "
                    f"default: the model's params, else {DEFAULT_REPEAT_LAST_N})."),
    _penalty_option("--presence-penalty", float, "Subtract this from tokens in the window (default: 0)."),
    _penalty_option("--frequency-penalty", float, "Subtract this per occurrence in the window (default: 0)."),
)

ctx_option = click.option(
    "--ctx", type=int, help=f"Context length in tokens (default: the model's num_ctx, else {DEFAULT_CTX})."
)

# --- the target past this machine's default devices: RPC servers, several GPUs ---------------------
# Not passed to each command's function: collected in the click context and read by
# `engine_settings` and `check`, so every command that loads a model takes them alike.


RPC_ENVVAR = "OLLAMA_SPEC_RPC"


def _collect_placement(ctx: click.Context, param: click.Parameter, value):
    ctx.meta.setdefault("placement", {})[param.name] = value
    return value


def current_placement() -> Placement:
    """The --rpc, --tensor-split, --split-mode and --main-gpu of the command being run."""
    ctx = click.get_current_context()
    flags = ctx.meta.get("placement", {})
    text = flags.get("rpc") or ""
    source = "--rpc"
    if ctx.get_parameter_source("rpc") is click.core.ParameterSource.ENVIRONMENT:
        # a variable is often assembled by scripts: blank items (a trailing comma) are left out
        source = f"${RPC_ENVVAR}"
        text = ",".join(item for item in text.split(",") if item.strip())
    servers = tuple(str(e) for e in parse_endpoints(text, source)) if text else ()
    return Placement(rpc_servers=servers, tensor_split=parse_tensor_split(flags.get("tensor_split")),
                     split_mode=flags.get("split_mode") or "layer", main_gpu=flags.get("main_gpu") or 0)


placement_options = _stack(
    click.option(
        "--rpc",
        envvar=RPC_ENVVAR,
        callback=_collect_placement,
        expose_value=False,
        metavar="HOST:PORT[,...]",
        help="llama.cpp RPC servers (`ollama-spec rpc-server` on each machine) that take target layers beside this "
        "machine's GPUs; the draft stays here. Trusted networks only: the protocol has no authentication.",
    ),
    click.option(
        "--tensor-split",
        callback=_collect_placement,
        expose_value=False,
        metavar="SHARES",
        help="Each device's share of the target, RPC servers first, then local GPUs (e.g. 3,1). Default: by free "
        "memory once the draft is placed.",
    ),
    click.option(
        "--split-mode",
        type=click.Choice(SPLIT_MODES),
        callback=_collect_placement,
        expose_value=False,
        help="How the target is split over several devices: layer (default), row (each matrix), none (--main-gpu only).",
    ),
    click.option(
        "--main-gpu",
        type=int,
        callback=_collect_placement,
        expose_value=False,
        help="With --split-mode none: the device that holds the whole target (index in the order above).",
    ),
)

loading_options = _stack(
    click.option(
        "--n-gpu-layers",
        type=int,
        default=None,
        help="Target layers on the GPU (-1: all; default: all, or as many as the memory check finds room for).",
    ),
    click.option(
        "--draft-n-gpu-layers", type=int, default=-1, show_default=True, help="Draft layers on the GPU (-1: all)."
    ),
    click.option("--threads", type=int, help="CPU threads (default: all cores)."),
    click.option(
        "--kv-type",
        type=click.Choice(["f16", "q8_0", "q4_0"]),
        default="f16",
        show_default=True,
        help="KV cache element type (q8_0 halves the cache; quantized caches use flash attention).",
    ),
    click.option("--no-check", "--force", "no_check", is_flag=True, help="Skip the memory check before loading."),
    repack_option,
    flash_attn_option,
    placement_options,
)


format_option = click.option(
    "--format", "output_format", metavar="json|SCHEMA",
    help="Keep the output to JSON: 'json' for a JSON object, or a JSON schema it must match (inline, or a "
         "file holding it), as Ollama's --format; a llama.cpp grammar masks what the target may write.",
)


think_option = click.option(
    "--think/--no-think", default=None,
    help="A thinking model (Qwen3, DeepSeek-R1): think before answering, or answer at once (its chat template "
         "is told, as Ollama's --think=false does). Default: the model's own.",
)


def think_setting(think: bool | None, model: ResolvedModel) -> bool | None:
    """--think/--no-think for a thinking model; for another, a note that it changes nothing (the
    servers answer such a request with a 400, as Ollama does; a command line goes on)."""
    if think is not None and not template_thinks(model.info.chat_template):
        flag = "--think" if think else "--no-think"
        click.echo(f"note: {model.name} is not a thinking model (its chat template has no <think>): {flag} "
                   "changes nothing", err=True)
        return None
    return think


def output_grammar(output_format: str | None) -> str | None:
    """--format as the GBNF grammar the output must match (None: free text)."""
    if output_format is None:
        return None
    if output_format == "json":
        return grammar_for_json()
    text = output_format
    if not output_format.lstrip().startswith(("{", "[")):
        try:
            text = Path(output_format).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidSetting(f"--format takes 'json', a JSON schema or a file holding one; cannot read "
                                 f"'{output_format}': {exc.strerror if isinstance(exc, OSError) else exc}") from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSetting(f"--format: the schema is not valid JSON: {exc}") from None
    return grammar_for_json(schema)


def sampling_settings(params: dict, *, temperature, top_k, top_p, min_p, seed) -> SamplingSettings:
    """The sampling flags, else the model's Ollama params, else Ollama's defaults."""
    return SamplingSettings(
        temperature=first_set(temperature, params.get("temperature"), DEFAULT_TEMPERATURE),
        top_k=int(first_set(top_k, params.get("top_k"), DEFAULT_TOP_K)),
        top_p=first_set(top_p, params.get("top_p"), DEFAULT_TOP_P),
        min_p=first_set(min_p, params.get("min_p"), DEFAULT_MIN_P),
        seed=first_set(seed, params.get("seed")),
        penalties=penalty_settings(params),
    )


def penalty_settings(params: dict) -> Penalties:
    """--repeat-penalty and the rest (collected in the click context), else the model's params, else off."""
    context = click.get_current_context(silent=True)
    flags = context.meta.get("penalties", {}) if context is not None else {}
    defaults = Penalties()
    return Penalties(**{name: first_set(flags.get(name), params.get(name), getattr(defaults, name))
                        for name in PENALTY_OPTIONS})


def engine_settings(
    params: dict, *, ctx, n_gpu_layers, draft_n_gpu_layers, threads, kv_type, no_check, repack, flash_attn="auto"
) -> EngineSettings:
    """The loading flags; the context defaults to the model's num_ctx, else DEFAULT_CTX."""
    if ctx is None and params.get("num_ctx") is not None and params["num_ctx"] < 1:
        # from the model's params layer (or a preset), not from a flag: say so, and what overrides it
        raise InvalidSetting(f"the model's params set num_ctx {params['num_ctx']}, not a positive number of tokens; "
                             "give --ctx to override it")
    return EngineSettings(
        n_ctx=int(first_set(ctx, params.get("num_ctx"), DEFAULT_CTX)),
        target_gpu_layers=n_gpu_layers,
        draft_gpu_layers=draft_n_gpu_layers,
        n_threads=threads,
        kv_type=kv_type,
        memory_check=not no_check,
        repack=decide_repack_for_cli(repack).enabled,
        flash_attention=flash_attn,
        placement=current_placement(),
    )


def model_stops(params: dict) -> tuple[str, ...]:
    """The stop strings in the model's Ollama params."""
    return tuple(s for s in params.get("stop", []) if isinstance(s, str))


UNTIL_CONTEXT_FULL = 2**31 - 1  # more tokens than any context holds: generation ends on a full context


def model_max_tokens(params: dict, unlimited: int | None = None) -> int | None:
    """The model's num_predict when it is a limit; Ollama's -1 (until the context is full) and -2 (fill the
    context) give `unlimited` (the CLI: UNTIL_CONTEXT_FULL; the server: None, up to the end of the context)."""
    value = params.get("num_predict")
    if isinstance(value, int) and value > 0:
        return value
    return unlimited if value in (-1, -2) else None


def first_set(*values):
    """The first value that is not None."""
    return next((v for v in values if v is not None), None)
