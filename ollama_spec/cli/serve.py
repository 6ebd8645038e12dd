"""`ollama-spec serve`: the store's models (or one pinned pair) behind OpenAI- and Ollama-compatible HTTP APIs."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import click

from ollama_spec.cli.common import notice
from ollama_spec.cli.flags import RunFlags, into
from ollama_spec.cli.options import (
    ctx_option,
    loading_options,
    models_dir_option,
    parallel_option_with,
    preset_option,
    sampling_options,
    speculation_options,
    verbose_option,
)
from ollama_spec.cli.settings import Options, engine_settings, flag_layer, server_settings
from ollama_spec.cli.targets import apply_preset, resolve_draft
from ollama_spec.decoding.parameters import K, refusal
from ollama_spec.engine.engine import Engine
from ollama_spec.engine.pairing import DraftChoice
from ollama_spec.errors import InvalidSetting
from ollama_spec.llama.backends import discover_devices
from ollama_spec.llama.log import set_verbose
from ollama_spec.models.modelfile import load_modelfile
from ollama_spec.models.resolve import ResolvedModel, resolve_model, template_warning
from ollama_spec.server import ServerState
from ollama_spec.server.serving.defaults import RequestDefaults
from ollama_spec.server.serving.keep_alive import parse_keep_alive
from ollama_spec.server.serving.settings import (
    DEFAULT_HOST,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_QUEUE,
    DEFAULT_PORT,
    ServerSettings,
)


@dataclass(frozen=True)
class ServeFlags(RunFlags):
    host: str
    port: int
    api_key: str | None
    aliases: tuple[str, ...]
    max_queue: int
    pairs: tuple[str, ...]
    presets: tuple[str, ...]
    no_draft: bool
    keep_alive: str
    max_loaded: int
    max_body: int
    origins: str
    upstream: str | None
    no_upstream: bool
    parallel: int | None


@click.command()
@click.argument("target", required=False)
@preset_option
@speculation_options
@sampling_options
@ctx_option
@loading_options
@click.option(
    "--host",
    default=DEFAULT_HOST,
    show_default=True,
    help="Address to listen on (0.0.0.0 exposes the server to the network: use --api-key).",
)
@click.option("--port", type=int, default=DEFAULT_PORT, show_default=True, help="Port (0: any free port).")
@click.option(
    "--api-key",
    envvar="OLLAMA_SPEC_API_KEY",
    help="Require 'Authorization: Bearer KEY' on every route but /health [env: OLLAMA_SPEC_API_KEY].",
)
@click.option(
    "--served-model-name",
    "aliases",
    multiple=True,
    help="Another name to list in /v1/models and report in responses (repeatable; the first is reported).",
)
@click.option(
    "--max-queue",
    type=int,
    default=DEFAULT_MAX_QUEUE,
    show_default=True,
    envvar="OLLAMA_MAX_QUEUE",
    help="Requests that may wait for a free slot; more get HTTP 503 with Retry-After [env: OLLAMA_MAX_QUEUE].",
)
@click.option(
    "--pair",
    "pairs",
    multiple=True,
    metavar="TARGET=DRAFT",
    help="Without TARGET: the draft for one target (DRAFT may be 'ngram'); repeatable. Others get their "
    "preset's, their manifest's or the store's best compatible draft.",
)
@click.option(
    "--preset",
    "presets",
    multiple=True,
    metavar="MODELFILE",
    help="Without TARGET: a Modelfile (or a shipped preset's name) for the model it is FROM: its DRAFT, "
    "PARAMETER and SYSTEM lines; repeatable.",
)
@click.option("--no-draft", is_flag=True, help="Without TARGET: serve every target alone.")
@click.option(
    "--keep-alive",
    envvar="OLLAMA_KEEP_ALIVE",
    default="5m",
    show_default=True,
    help="Without TARGET: how long a model stays loaded after its last request (0: unload at once; "
    "negative: forever); a request's keep_alive wins [env: OLLAMA_KEEP_ALIVE].",
)
@click.option(
    "--max-loaded",
    type=click.IntRange(min=0),
    envvar="OLLAMA_MAX_LOADED_MODELS",
    default=0,
    help="Without TARGET: models loaded at once (0: 3 per GPU) [env: OLLAMA_MAX_LOADED_MODELS].",
)
@click.option(
    "--max-body",
    type=int,
    default=DEFAULT_MAX_BODY_BYTES,
    show_default=True,
    help="Largest request body in bytes; larger ones get HTTP 413.",
)
@click.option(
    "--origins",
    envvar="OLLAMA_ORIGINS",
    default="",
    help="Web pages (origins, comma-separated, * for any) whose scripts may call the server, beside "
    "localhost's and apps', which always may, as with Ollama [env: OLLAMA_ORIGINS].",
)
@click.option(
    "--upstream",
    metavar="URL",
    envvar="OLLAMA_SPEC_UPSTREAM",
    help="The Ollama daemon to stand in front of: what this server cannot run or does not serve goes "
    "there unchanged, and /api/tags lists its models after ours (default: $OLLAMA_HOST when an Ollama "
    "daemon answers there) [env: OLLAMA_SPEC_UPSTREAM].",
)
@click.option("--no-upstream", is_flag=True, help="Forward nothing: answer only what this server serves.")
@parallel_option_with(
    "Requests that run at once, each in a slot of its own (its own --ctx tokens in both models' caches); "
    "their draft and verify passes run as one batch (default: as many as the memory check fits, up to 4)."
)
@verbose_option
@models_dir_option
@click.pass_context
@into(ServeFlags)
def serve(context: click.Context, flags: ServeFlags) -> None:
    """Serve TARGET, drafted by --draft, over OpenAI's and Ollama's HTTP APIs; without TARGET, the whole store.

    Without TARGET, as Ollama does: /api/tags and /v1/models list every model of the store that can
    run, a model loads on its first request (which waits for it), stays for its keep_alive, and idle
    ones are unloaded, least recently used first, when a new one does not fit. Each target gets its
    draft from --pair, --preset, its manifest's draft layer, its own MTP layers where they pay or the
    store's best compatible draft, and its context as Ollama picks it (num_ctx, else
    $OLLAMA_CONTEXT_LENGTH, else 4k/32k/256k by GPU memory; never above what the model was trained on;
    lowered until the pair fits).

    With TARGET (or -f), that pair loads once (after the memory check) and answers every model name.
    Routes: /v1/chat/completions, /v1/completions, /v1/responses, /v1/embeddings, /v1/models,
    /api/chat, /api/generate, /api/embed, /api/tags, /api/show, /api/ps, /api/pull, /api/delete,
    /api/copy. JSON output (Ollama's format, OpenAI's response_format) is kept to by a grammar.
    In front of a running Ollama (--upstream URL; by default $OLLAMA_HOST when a daemon answers
    there): models this server cannot run and routes it does not serve go to the daemon unchanged,
    /api/tags and /v1/models list its models after ours, and a model the daemon holds is unloaded
    there before it loads here.
    Up to --parallel requests run at once, each in a slot of its own, their draft and verify passes
    batched together; a request goes to the slot that holds most of its prompt (a chat's next turn
    evaluates only the new tokens), and prefixes that lose their slot are kept in host RAM. Sampling
    flags set the defaults; each request may override them.
    GET /health, GET /metrics (Prometheus).

    \b
    Examples:
      ollama-spec serve   # every model of the store, loaded as asked for
      ollama-spec serve --pair llama3.1:70b=llama3.2:1b --keep-alive 30m
      ollama-spec serve llama3.1:70b --draft llama3.2:1b
      ollama-spec serve llama3.1:8b -d llama3.2:1b -k 6 --ctx 8192 --served-model-name gpt-4o
      ollama-spec serve qwen2.5-coder:32b -d ngram   # draftless prompt lookup
      ollama-spec serve --pair glm-4.5-air=mtp   # a target's own MTP (NextN) layers
      ollama-spec serve -f llama3.3-70b   # a shipped preset: target, draft and parameters
      ollama-spec serve --upstream http://127.0.0.1:11434   # in front of a running Ollama
      OLLAMA_HOST=http://127.0.0.1:8000 ollama run llama3.1:8b   # Ollama's CLI, talking to this server
    """
    set_verbose(flags.verbose)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    # the shared options go to the settings with where each came from (the command line, a -f preset, the
    # default): the rule that picks between them needs both
    options = Options.of(context)
    if flags.target is None:
        _serve_store(flags, options)
    else:
        _serve_pair(flags, options)


def _serve_store(flags: ServeFlags, options: Options) -> None:
    """The whole store, its models loaded as they are asked for."""
    from ollama_spec.server import serve as run_server
    from ollama_spec.server.http.run import bind

    state = store_state(options, flags.models_dir)
    sock = bind(flags.host, flags.port)
    try:
        state.upstream = daemon_upstream(flags.upstream, flags.no_upstream, flags.host, sock.getsockname()[1], state)
        run_server(state, sock)
    finally:
        sock.close()


def _serve_pair(flags: ServeFlags, options: Options) -> None:
    """TARGET and its draft, loaded once."""
    from ollama_spec.server import serve as run_server
    from ollama_spec.server.http.run import bind

    for name in ("pairs", "presets", "no_draft"):
        if options[name]:
            raise click.UsageError(f"--{name.rstrip('s').replace('_', '-')} is for serve without a TARGET")
    target_model = apply_preset(resolve_model(flags.target, flags.models_dir), flags.preset)
    if warning := template_warning(target_model, "clients get the model's plain continuation"):
        logging.getLogger(__name__).warning(warning)
    choice = resolve_draft(flags.draft, flags.models_dir, target_model)
    server = server_settings(options)
    settings = request_defaults(options, server).over(target_model.params, server)
    sock = bind(flags.host, flags.port)  # before loading: a taken port fails in a second, not after a 40 GB load
    try:
        pair = pinned_pair(target_model, choice, options, settings)
        with Engine.load(pair.load, notice=notice) as engine:  # checked and planned once, in pinned_pair
            engine.costs.online = True  # -k auto learns its costs from the first passes: no timing at load
            state = ServerState(engine, settings)
            state.models_dir = flags.models_dir  # where /api/pull, /api/delete and /api/copy act
            port = sock.getsockname()[1]
            state.upstream = daemon_upstream(flags.upstream, flags.no_upstream, flags.host, port, state)
            run_server(state, sock)
    finally:
        sock.close()


def daemon_upstream(url: str | None, off: bool, host: str, port: int, state: ServerState):
    """The Upstream for --upstream URL (else $OLLAMA_HOST's daemon, if one answers there), or None."""
    from ollama_spec.server.http.upstream import Upstream, default_upstream, is_own_address, ollama_host_url

    if off:
        if url:
            raise click.UsageError("give --upstream URL or --no-upstream, not both")
        return None
    if url:
        url = ollama_host_url(url)
        if is_own_address(url, host, port):
            raise click.UsageError(f"--upstream {url} is this server's own address: it would forward to itself")
    else:
        url = default_upstream(host, port)
        if url is None:
            return None
    upstream = Upstream(url, own_key=bool(state.settings.api_key))
    logging.getLogger("ollama_spec.server").info(
        "in front of the Ollama daemon at %s: models and routes not served here go there", url
    )
    return upstream


def pinned_pair(target: ResolvedModel, draft: DraftChoice, options: Options, settings):
    """The pair checked (engine/load_plan), with the loading flags, the repack choice and its fit: the context
    chosen as Ollama chooses it, lowered until the pair fits, and the slots that fit (the engine loads with
    these and decides none of it again)."""
    from ollama_spec.engine.load_plan import check_drafter, require_target
    from ollama_spec.llama.canary import decide_repack
    from ollama_spec.server.serving.pairs import PairPlan, fit_context

    require_target(target)
    model, engine_config = check_drafter(target, draft.model, engine_settings(target.params, options, draft))
    given = target.params.get("num_ctx")
    flag = options["ctx"]
    devices, notes = discover_devices() if engine_config.memory_check or flag is None else ([], [])
    pair = PairPlan(target.name, target, model, "", settings, engine_config, repack=decide_repack(engine_config.repack))
    return fit_context(pair, given, devices, notes, flag)


def store_state(options: Options, models_dir: str | None) -> ServerState:
    """The state of a server over the whole store: its models loaded as they are asked for."""
    from ollama_spec.server.serving.pairs import StorePairs
    from ollama_spec.server.serving.scheduler import Scheduler, SchedulerSettings

    if options["draft"]:
        raise click.UsageError("--draft needs a TARGET; without one, give --pair TARGET=DRAFT")
    pairs = {}
    for text in options["pairs"]:
        name, sep, draft = text.partition("=")
        if not sep or not name.strip() or not draft.strip():
            raise click.UsageError(f"--pair takes TARGET=DRAFT, got {text!r}")
        pairs[name.strip()] = draft.strip()
    presets = {}
    for path in options["presets"]:
        modelfile = load_modelfile(path, refusal)
        presets[modelfile.model] = modelfile
    settings = server_settings(options)  # the flags alone: checked now, before anything listens
    store = StorePairs(
        models_dir=models_dir,
        pairs=pairs,
        presets=presets,
        no_draft=options["no_draft"],
        engine=engine_settings({}, options),
        ctx=options["ctx"],
        settings=settings,
        defaults=request_defaults(options, settings),
    )
    try:
        keep_alive = parse_keep_alive(options["keep_alive"])
    except InvalidSetting as exc:
        raise InvalidSetting(f"--keep-alive: {exc}") from None
    scheduler = Scheduler(store, SchedulerSettings(keep_alive, options["max_loaded"]), None, settings.max_queue)
    return ServerState(None, settings, scheduler)


def request_defaults(options: Options, flags: ServerSettings) -> RequestDefaults:
    """The sampling and speculation flags given, as the layer the server lays over each model's params (a -f
    preset's values lie in the model's params). `flags`: server_settings, where the flags were checked and
    -k capped, with its note: the capped K is the one laid."""
    layer = flag_layer(options)
    if K in layer:
        layer[K] = flags.speculation.num_speculative_tokens
    return RequestDefaults(layer, proposer=flags.speculation.proposer)  # --draft ngram, --ngram
