"""What a command parsed, turned into the core's frozen settings: one function per concern.

A flag wins, then the model's Ollama params (with a -f preset's laid over them), then the core's
defaults: for sampling, K and the answer's length that rule is decoding/parameters.resolve's, which
`flag_layer` hands the flags to by Ollama's names. Each function takes the command's `Options`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from ollama_spec.bench.settings import BenchSettings
from ollama_spec.cli.options import RPC_ENVVAR
from ollama_spec.decoding.parameters import SAMPLING, K, Resolved, resolve
from ollama_spec.decoding.penalties import OPTIONS as PENALTY_OPTIONS
from ollama_spec.decoding.proposer_table import proposer_for
from ollama_spec.engine.engine import DEFAULT_CTX, DEFAULT_MAX_TOKENS, EngineSettings, Request
from ollama_spec.engine.pairing import DraftChoice
from ollama_spec.errors import InvalidSetting
from ollama_spec.llama.canary import RepackDecision, decide_repack
from ollama_spec.llama.grammar import grammar_for_json
from ollama_spec.llama.rpc import parse_endpoints
from ollama_spec.models.resolve import ResolvedModel
from ollama_spec.planning.placement import Placement, parse_tensor_split
from ollama_spec.prompting.thinking import template_thinks

if TYPE_CHECKING:
    from ollama_spec.server.serving.settings import ServerSettings

UNTIL_CONTEXT_FULL = 2**31 - 1  # more tokens than any context holds: generation ends on a full context


@dataclass(frozen=True)
class Options:
    """A command's parsed options, and where each came from (the command line, a -f preset, an
    environment variable, the default)."""

    values: Mapping[str, Any]
    sources: Mapping[str, ParameterSource | None] = field(default_factory=dict)

    @classmethod
    def of(cls, ctx: click.Context) -> Options:
        return cls(dict(ctx.params), {name: ctx.get_parameter_source(name) for name in ctx.params})

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def given(self, name: str) -> bool:
        """Whether `name` was given on the command line."""
        return self.sources.get(name) is ParameterSource.COMMANDLINE


def first_set(*values):
    """The first value that is not None."""
    return next((v for v in values if v is not None), None)


def flag_layer(options: Options) -> dict[str, Any]:
    """The flags a command was given, by Ollama's parameter names: the layer `resolve` lays over a model's
    params. The sampling flags count where set; -k, --draft-p-min and --ngram-size only where given on the
    command line (their defaults, and a -f preset's values, are the layers below: the preset's lie in the
    model's params); --max-tokens is num_predict, --stop the stop strings added to the model's."""
    values = options.values
    layer = {name: values[name] for name in (*SAMPLING, *PENALTY_OPTIONS) if values.get(name) is not None}
    layer |= {name: values[flag] for flag, name in _SPECULATION_FLAGS.items() if options.given(flag)}
    if values.get("max_tokens") is not None:
        layer["num_predict"] = values["max_tokens"]
    if values.get("stop"):
        layer["stop"] = tuple(values["stop"])
    return layer


_SPECULATION_FLAGS = {"k": K, "draft_p_min": "draft_p_min", "ngram_size": "ngram_size"}


def resolved(params: Mapping, options: Options) -> Resolved:
    """The command's flags over the model's params (`params`), by the one rule every face resolves by;
    the proposer is the one --draft names (beside --ngram's lookup where given), and a K past one verify
    batch is capped with a note on stderr."""
    proposer = proposer_for(options.values.get("draft"), with_ngram=bool(options.values.get("with_ngram")))
    return resolve(params, flag_layer(options), proposer=proposer, notice=_note)


def _note(text: str) -> None:
    click.echo(f"note: {text}", err=True)


def placement_settings(options: Options) -> Placement:
    """--rpc (or $OLLAMA_SPEC_RPC), --tensor-split, --split-mode and --main-gpu."""
    text = options["rpc"] or ""
    source = "--rpc"
    if options.sources.get("rpc") is ParameterSource.ENVIRONMENT:
        # a variable is often assembled by scripts: blank items (a trailing comma) are left out
        source = f"${RPC_ENVVAR}"
        text = ",".join(item for item in text.split(",") if item.strip())
    servers = tuple(str(e) for e in parse_endpoints(text, source)) if text else ()
    return Placement(
        rpc_servers=servers,
        tensor_split=parse_tensor_split(options["tensor_split"]),
        split_mode=options["split_mode"] or "layer",
        main_gpu=options["main_gpu"] or 0,
    )


def repack_setting(force: bool | None) -> RepackDecision:
    """The repack decision; says on stderr, once, when a fresh canary run turned repacking off."""
    decision = decide_repack(force)
    if decision.note:
        click.echo(f"note: {decision.note}", err=True)
    return decision


def engine_settings(params: Mapping, options: Options, draft: DraftChoice | None = None) -> EngineSettings:
    """The loading flags; the context defaults to the model's num_ctx, else DEFAULT_CTX. `draft`: the draft
    chosen, where it loads with the target (its own MTP layers: DraftChoice.engine_settings)."""
    ctx = options["ctx"]
    if ctx is None and params.get("num_ctx") is not None and params["num_ctx"] < 1:
        # from the model's params layer (or a preset), not from a flag: say so, and what overrides it
        raise InvalidSetting(
            f"the model's params set num_ctx {params['num_ctx']}, not a positive number of tokens; "
            "give --ctx to override it"
        )
    settings = EngineSettings(
        n_ctx=int(first_set(ctx, params.get("num_ctx"), DEFAULT_CTX)),
        target_gpu_layers=options["n_gpu_layers"],
        draft_gpu_layers=options["draft_n_gpu_layers"],
        n_threads=options["threads"],
        kv_type=options["kv_type"],
        memory_check=not options["no_check"],
        repack=repack_setting(options["repack"]).enabled,
        flash_attention=options["flash_attn"],
        placement=placement_settings(options),
        parallel=options.values.get("parallel", 1),  # serve: None, as many as fit up to 4
    )
    return draft.engine_settings(settings) if draft is not None else settings


def request_settings(model: ResolvedModel, options: Options, **fields) -> Request:
    """What generate and chat ask of every generation: --max-tokens (else the model's num_predict), the
    stop strings (generate's --stop, then the model's), sampling, speculation, --format and --think;
    `fields` give the rest (the prompt, the system prompt)."""
    chosen = resolved(model.params, options)
    limit = chosen.max_tokens
    if limit is None:
        limit = UNTIL_CONTEXT_FULL if chosen.unlimited else DEFAULT_MAX_TOKENS
    return Request(
        max_tokens=int(limit),
        stop=chosen.stop,
        sampling=chosen.sampling,
        speculation=chosen.speculation,
        grammar=output_grammar(options["output_format"]),
        think=think_setting(options["think"], model),
        **fields,
    )


def server_settings(options: Options) -> ServerSettings:
    """serve's flags as ServerSettings: the address, the API key, the queue, and each request's defaults as
    the flags say them over no model's params (checked now, before anything listens; each model's are laid
    under them by server/serving/defaults.RequestDefaults)."""
    from ollama_spec.server.serving.settings import ServerSettings  # the server extra: only serve loads it

    chosen = resolved({}, options)
    return ServerSettings(
        host=options["host"],
        port=options["port"],
        api_key=options["api_key"] or None,
        aliases=tuple(options["aliases"]),
        max_queue=options["max_queue"],
        max_body_bytes=options["max_body"],
        origins=tuple(o.strip() for o in options["origins"].split(",") if o.strip()),
        sampling=chosen.sampling,
        speculation=chosen.speculation,
    )


def bench_settings(options: Options, ks: tuple[tuple[int, ...], bool]) -> BenchSettings:
    """bench's flags, with -k read by bench.settings.parse_k_list (fixed Ks, and whether auto is one)."""
    fixed_ks, auto = ks
    return BenchSettings(
        ks=fixed_ks,
        auto=auto,
        ngram=options["ngram"],
        max_tokens=options["max_tokens"],
        runs=options["runs"],
        temperature=options["temperature"],
        seed=options["seed"],
        warmup=options["warmup"],
        n_threads=options["threads"],
        n_ctx=options["ctx"],
        memory_check=not options["no_check"],
        repack=repack_setting(options["repack"]).enabled,
        flash_attention=options["flash_attn"],
        placement=placement_settings(options),
    )


def think_setting(think: bool | None, model: ResolvedModel) -> bool | None:
    """--think/--no-think for a thinking model; for another, a note that it changes nothing (the
    servers answer such a request with a 400, as Ollama does; a command line goes on)."""
    if think is not None and not template_thinks(model.info.chat_template):
        flag = "--think" if think else "--no-think"
        click.echo(
            f"note: {model.name} is not a thinking model (its chat template has no <think>): {flag} changes nothing",
            err=True,
        )
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
            raise InvalidSetting(
                f"--format takes 'json', a JSON schema or a file holding one; cannot read "
                f"'{output_format}': {exc.strerror if isinstance(exc, OSError) else exc}"
            ) from None
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSetting(f"--format: the schema is not valid JSON: {exc}") from None
    return grammar_for_json(schema)
