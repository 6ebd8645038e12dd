"""`ollama-spec generate`: the target alone, or target + draft with speculative decoding."""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import dataclass, field, replace

import click

from ollama_spec.bench.settings import WARMUP_TOKENS
from ollama_spec.cli.common import notice
from ollama_spec.cli.flags import RunFlags, into
from ollama_spec.cli.options import (
    ctx_option,
    format_option,
    loading_options,
    models_dir_option,
    preset_option,
    sampling_options,
    show_draft_option,
    speculation_options,
    think_option,
    verbose_option,
)
from ollama_spec.cli.results import busy_machine_note, format_comparison, format_stats, result_json, speedup
from ollama_spec.cli.settings import Options, engine_settings, request_settings
from ollama_spec.cli.show_draft import colour_on, legend, printed
from ollama_spec.cli.targets import apply_preset, check_draft_flags, drafter_name, resolve_draft
from ollama_spec.engine.engine import (
    DEFAULT_MAX_TOKENS,
    NEAR_TIE_LOGITS,
    Engine,
    Generation,
    Request,
    Result,
    first_difference,
)
from ollama_spec.llama.backends import unused_gpu_warning
from ollama_spec.llama.log import set_verbose
from ollama_spec.models.resolve import resolve_model, template_warning
from ollama_spec.prompting.messages import ChatMessage
from ollama_spec.prompting.text_stream import Run, drafted_spans


@dataclass(frozen=True)
class GenerateFlags(RunFlags):
    prompt: str | None
    max_tokens: int | None
    stop: tuple[str, ...]
    system: str | None
    raw: bool
    output_format: str | None
    think: bool | None
    suffix: str | None
    stats: bool
    compare: bool
    show_draft: bool
    as_json: bool


@click.command()
@click.argument("target")
@click.argument("prompt", required=False)
@preset_option
@speculation_options
@sampling_options
@click.option(
    "--max-tokens", "-n", type=int, help=f"Most tokens to generate (default: num_predict, else {DEFAULT_MAX_TOKENS})."
)
@ctx_option
@click.option("--stop", multiple=True, help="Stop string (repeatable; adds to the model's own).")
@click.option("--system", help="System prompt (default: the model's system layer).")
@click.option("--raw", is_flag=True, help="No chat template: continue the prompt text as it is.")
@format_option
@think_option
@click.option(
    "--suffix",
    help="Fill in the middle: the text after the gap, PROMPT being the text before it (code "
    "models with fill-in-the-middle tokens, e.g. qwen2.5-coder).",
)
@loading_options
@click.option("--stats", is_flag=True, help="Print speed and acceptance statistics to stderr.")
@click.option(
    "--compare",
    is_flag=True,
    help="Run the target alone first, then with the draft; print both speeds and the speed-up.",
)
@show_draft_option
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object (text + statistics) at the end; with --show-draft, the drafted text's "
    "character spans as draft_spans.",
)
@verbose_option
@models_dir_option
@click.pass_context
@into(GenerateFlags)
def generate(context: click.Context, flags: GenerateFlags) -> None:
    """Generate text with TARGET, drafted by --draft; PROMPT or standard input.

    The output is exactly what TARGET alone writes (greedy: token for token; sampling: the
    same distribution), produced with fewer passes over the target's weights.

    \b
    Examples:
      ollama-spec generate llama3.1:70b --draft llama3.2:1b "Why is the sky blue?"
      echo "def fib(n):" | ollama-spec generate qwen2.5-coder:32b -d qwen2.5-coder:0.5b --raw -t 0
      ollama-spec generate llama3.1:8b -d llama3.2:1b -k 8 --stats "Explain KV caches."   # fixed K
      ollama-spec generate llama3.1:8b -d llama3.2:1b --compare -t 0 "Write a haiku."
      ollama-spec generate llama3.1:8b -d llama3.2:1b --show-draft "Write a haiku."   # drafted text in green
      ollama-spec generate qwen2.5-coder:32b -d ngram "Rename x to count in: $(cat f.py)"   # no draft model
      ollama-spec generate glm-4.5-air -d mtp "Explain RoPE."   # the target's own MTP (NextN) layers
      ollama-spec generate -f llama3.1-70b "Why is the sky blue?"   # a shipped preset (modelfiles/)
      ollama-spec generate llama3.1:8b -d llama3.2:1b --format person.schema.json "Invent a person."

    With -f, a single argument is the PROMPT (TARGET comes from the file's FROM line).
    """
    set_verbose(flags.verbose)
    # the sampling, speculation and loading options go to the settings with where each came from (the
    # command line, a -f preset, the default): the rule that picks between them needs both
    options = Options.of(context)
    target, prompt = flags.target, flags.prompt
    if flags.preset is not None and prompt is None and options.given("target"):
        target, prompt = flags.preset.model, target
    prompt = _prompt_text(prompt)
    target_model = apply_preset(resolve_model(target, flags.models_dir), flags.preset)
    raw, suffix = flags.raw, flags.suffix
    if not raw and suffix is None and (warning := template_warning(target_model, "use --raw to continue the text")):
        click.echo(f"warning: {warning}", err=True)
    choice = resolve_draft(flags.draft, flags.models_dir, target_model)
    draft_model = choice.model
    history = target_model.messages if not raw else ()  # Ollama prepends a model's MESSAGE history
    request = request_settings(
        target_model,
        options,
        prompt=prompt,
        messages=(*history, ChatMessage("user", prompt)) if history else (),
        system=flags.system,
        raw=raw,
        suffix=suffix,
    )
    speculative = draft_model is not None or choice.source is not None
    if flags.compare and not speculative:
        raise click.UsageError("--compare needs --draft")
    show_draft, as_json = flags.show_draft, flags.as_json
    check_draft_flags(show_draft=show_draft, ngram=flags.with_ngram, choice=choice)
    engine = _load(target_model, draft_model, engine_settings(target_model.params, options, choice), flags.compare)
    runs = [] if show_draft and as_json else None
    with engine:
        run = _run(engine, request, compare=flags.compare, quiet=as_json, show_draft=show_draft, runs=runs)
    if as_json:
        drafter = drafter_name(choice, engine.settings)
        click.echo(json.dumps(_json(target_model.name, drafter, run, runs), indent=2))
        return
    _print_outcome(run, greedy=request.sampling.greedy, stats=flags.stats, speculative=speculative)


@dataclass
class _Run:
    """A generation as generate ran it: the result, the target alone's where compared, and where a greedy
    difference from it comes from (`margins`, `batch_size`, `replayed`: see format_comparison)."""

    result: Result
    n_ctx: int
    baseline: Result | None = None
    margins: list[float] = field(default_factory=list)
    batch_size: int | None = None
    replayed: bool = False


def _prompt_text(prompt: str | None) -> str:
    """PROMPT, with what a pipe holds before it; standard input alone where no PROMPT was given."""
    if prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise click.UsageError("give a PROMPT argument or pipe the prompt on standard input")
        prompt = _read_stdin()
        if not prompt.strip():
            raise click.UsageError("standard input was empty: pipe a prompt, or give a PROMPT argument")
    elif (piped := _piped_input()) is not None:
        prompt = f"{piped} {prompt}"  # `cat file | generate M "explain this"`: the file, then the ask, as `ollama run`
    return prompt


def _load(target_model, draft_model, settings, compare: bool) -> Engine:
    """The pair loaded, with the notes that go before it: a busy machine for --compare, an unused GPU."""
    if compare and (busy := busy_machine_note()) is not None:
        click.echo(f"note: {busy}", err=True)
    if (warning := unused_gpu_warning()) is not None:
        click.echo(f"warning: {warning}", err=True)
    loading = " and ".join(model.name for model in (target_model, draft_model) if model is not None)
    with notice.ticking(f"loading {loading}"):  # a large model's load is silent in llama.cpp
        return Engine(target_model, draft_model, settings, notice=notice)


def _run(
    engine: Engine, request: Request, *, compare: bool, quiet: bool, show_draft: bool, runs: list[Run] | None
) -> _Run:
    """Stream the generation (after the target alone's, with --compare; drafted text coloured with
    --show-draft, or its runs gathered into `runs`); where a greedy comparison parts, find whether
    rounding explains it."""
    colour = show_draft and not quiet and colour_on()
    baseline = _run_baseline(engine, request, quiet) if compare else None
    if show_draft and not quiet:
        click.echo(legend(colour), err=True)
    # compared: the run's target batches are kept, to replay a greedy difference as it batched it
    traced = replace(request, trace_batches=True) if baseline is not None else request
    result = _stream(engine.generate(traced), quiet=quiet, colour=colour, runs=runs)
    run = _Run(result, engine.target.n_ctx, baseline)
    if baseline is None or not request.sampling.greedy or baseline.tokens == result.tokens:
        return run
    prompt = engine.prompt_tokens(request)
    run.margins = engine.greedy_margins(prompt, baseline.tokens, request=request)
    at = first_difference(baseline.tokens, result.tokens)
    if at < min(len(run.margins), len(result.tokens)) and run.margins[at] >= NEAR_TIE_LOGITS:
        token = result.tokens[at]
        run.batch_size = engine.chosen_in_a_batch(prompt, baseline.tokens, at, token, request=request)
        run.replayed = run.batch_size is None and engine.chosen_as_batched(
            prompt, baseline.tokens, result.speculation.batches or (), at, token, request=request
        )
    return run


def _json(target: str, draft: str | None, run: _Run, runs: list[Run] | None) -> dict:
    """--json's object: the result, the drafted spans with --show-draft, the target alone's with --compare."""
    data = result_json(target, draft, run.result)
    if runs is not None:
        data["draft_spans"] = drafted_spans(runs)
    if run.baseline is not None:
        data["baseline"] = result_json(target, None, run.baseline)
        data["speedup"] = speedup(run.baseline, run.result)
    return data


def _print_outcome(run: _Run, *, greedy: bool, stats: bool, speculative: bool) -> None:
    """After the streamed text: the comparison, why it stopped on a full context, the statistics."""
    click.echo()
    sys.stdout.flush()
    if run.baseline is not None:
        comparison = format_comparison(
            run.baseline,
            run.result,
            greedy=greedy,
            margins=run.margins,
            batch_size=run.batch_size,
            replayed=run.replayed,
        )
        click.echo(comparison, err=True)
    if run.result.finish_reason == "context":
        click.echo(f"stopped: the context ({run.n_ctx} tokens) is full; raise --ctx for longer output", err=True)
    if stats:
        click.echo(format_stats(run.result, speculative=speculative), err=True)


def _stream(generation: Generation, *, quiet: bool, colour: bool = False, runs: list[Run] | None = None) -> Result:
    """Print the text as it is accepted (unless quiet; drafted text coloured with `colour`); return the
    finished result. Quiet, with a `runs` list: the text's runs gathered into it instead."""
    if runs is not None:
        runs.extend(generation.pieces())
        return generation.result
    wrote = False
    try:
        for piece in printed(generation, colour):
            if not quiet:
                click.echo(piece, nl=False)
                sys.stdout.flush()
                wrote = True
    except KeyboardInterrupt:
        if wrote:  # end the partial answer's line: "Interrupted." goes on a line of its own
            click.echo()
        raise
    return generation.result


def _run_baseline(engine: Engine, request: Request, quiet: bool) -> Result:
    engine.costs.prepare(request.speculation)  # -k auto's timing now, with its own notes: not in the warm-up's
    with notice.ticking("warming up both models (untimed)"):
        _warm_up(engine, request)
    if not quiet:
        click.echo("--- target alone ---", err=True)
    result = _stream(engine.generate(request, use_draft=False), quiet=quiet)
    engine.clear_cache()  # the drafted run reads the prompt too, so that both are timed alike
    if not quiet:
        click.echo()
        sys.stdout.flush()
        click.echo("--- target + draft ---", err=True)
    return result


def _warm_up(engine: Engine, request: Request) -> None:
    """A few untimed tokens with each, before the timed runs, as `bench` warms up each row: the first
    run after loading may pay for what the load left undone (the demo pair's target alone, timed
    first: 31.6-35.5 tok/s; timed after other runs in the same process: 41-44). This shared VM's
    speed also drifts between processes, so one demo shows 1.8-2.3x either way."""
    short = replace(request, max_tokens=min(WARMUP_TOKENS, request.max_tokens))
    for use_draft in (False, True):
        "".join(engine.generate(short, use_draft=use_draft))
        engine.clear_cache()


def _piped_input() -> str | None:
    """What a pipe or a redirected file on standard input holds (None for a terminal, /dev/null, or a
    socket that may never close): `ollama run` puts it before the prompt argument."""
    try:
        mode = os.fstat(sys.stdin.fileno()).st_mode
    except (AttributeError, OSError, ValueError):
        return None
    if not (stat.S_ISFIFO(mode) or stat.S_ISREG(mode)):
        return None
    text = _read_stdin()
    return text if text.strip() else None


def _read_stdin() -> str:
    """Standard input as text; bytes that are not UTF-8 become U+FFFD rather than a crash."""
    source = getattr(sys.stdin, "buffer", None)
    return source.read().decode("utf-8", errors="replace") if source is not None else sys.stdin.read()
