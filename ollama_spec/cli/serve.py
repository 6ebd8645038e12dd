"""`ollama-spec serve`: the pair behind OpenAI- and Ollama-compatible HTTP APIs."""

from __future__ import annotations

import logging

import click

from ollama_spec.cli.common import notice
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
from ollama_spec.cli.settings import Options, engine_settings, server_settings
from ollama_spec.cli.targets import apply_preset, resolve_draft
from ollama_spec.engine.engine import Engine
from ollama_spec.llama.log import set_verbose
from ollama_spec.models.resolve import resolve_model, template_warning
from ollama_spec.server.core.settings import DEFAULT_HOST, DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_QUEUE, DEFAULT_PORT


@click.command()
@click.argument("target")
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
    help="Requests that may wait for a free slot; more get HTTP 503 with Retry-After.",
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
@parallel_option_with(
    "Requests that run at once, each in a slot of its own (its own --ctx tokens in both models' caches); "
    "their draft and verify passes run as one batch (default: as many as the memory check fits, up to 4)."
)
@verbose_option
@models_dir_option
@click.pass_context
def serve(
    context: click.Context, target, preset, draft, host, port, verbose, models_dir, **_
) -> None:  # **_: see Options
    """Serve TARGET, drafted by --draft, over OpenAI's and Ollama's HTTP APIs.

    Loads the pair once (after the memory check) and answers /v1/chat/completions,
    /v1/completions, /v1/responses, /v1/embeddings, /v1/models, /api/chat, /api/generate,
    /api/embed, /api/tags, /api/show, /api/ps; any model name a client sends is answered by this
    pair. JSON output (Ollama's format, OpenAI's response_format) is kept to by a grammar.
    Up to --parallel requests run at once, each in a slot of its own, their draft and verify passes
    batched together; a request goes to the slot that holds most of its prompt (a chat's next turn
    evaluates only the new tokens), and prefixes that lose their slot are kept in host RAM. Sampling
    flags set the defaults; each request may override them.
    GET /health, GET /metrics (Prometheus).

    \b
    Examples:
      ollama-spec serve llama3.1:70b --draft llama3.2:1b
      ollama-spec serve llama3.1:8b -d llama3.2:1b -k 6 --ctx 8192 --served-model-name gpt-4o
      ollama-spec serve qwen2.5-coder:32b -d ngram   # draftless prompt lookup
      ollama-spec serve -f llama3.3-70b   # a shipped preset: target, draft and parameters
      OLLAMA_HOST=http://127.0.0.1:8000 ollama run llama3.1:8b   # Ollama's CLI, talking to this server
    """
    from ollama_spec.server import ServerState
    from ollama_spec.server import serve as run_server
    from ollama_spec.server.run import bind

    set_verbose(verbose)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:     %(message)s")
    target_model = apply_preset(resolve_model(target, models_dir), preset)
    if warning := template_warning(target_model, "clients get the model's plain continuation"):
        logging.getLogger(__name__).warning(warning)
    draft_model = resolve_draft(draft, models_dir, target_model)
    options = Options.of(context)
    settings = server_settings(target_model.params, options)
    sock = bind(host, port)  # before loading: a taken port fails in a second, not after a 40 GB load
    try:
        engine_config = engine_settings(target_model.params, options)
        with Engine(target_model, draft_model, engine_config, notice=notice) as engine:
            engine.costs.prepare(settings.speculation)  # before /health answers: not on the first request
            run_server(ServerState(engine, settings), sock)
    finally:
        sock.close()
