"""`ollama-spec generate`: the target alone, or target + draft with speculative decoding."""

from __future__ import annotations

import json
import os
import stat
import sys
from dataclasses import replace

import click

from ollama_spec.bench.settings import WARMUP_TOKENS
from ollama_spec.cli.common import notice
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
from ollama_spec.cli.settings import Options, engine_settings, request_settings
from ollama_spec.cli.show_draft import colour_on, legend, printed
from ollama_spec.cli.targets import apply_preset, check_draft_flags, resolve_draft
from ollama_spec.decoding.proposer_table import named_source
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
def generate(
    context: click.Context,
    target,
    prompt,
    preset,
    draft,
    system,
    raw,
    suffix,
    stats,
    compare,
    show_draft,
    as_json,
    verbose,
    models_dir,
    **_,
) -> None:  # **_: the shared options, read through Options (with their sources)
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
      ollama-spec generate -f llama3.1-70b "Why is the sky blue?"   # a shipped preset (modelfiles/)
      ollama-spec generate llama3.1:8b -d llama3.2:1b --format person.schema.json "Invent a person."

    With -f, a single argument is the PROMPT (TARGET comes from the file's FROM line).
    """
    set_verbose(verbose)
    options = Options.of(context)
    if preset is not None and prompt is None and options.given("target"):
        target, prompt = preset.model, target
    if prompt is None:
        if sys.stdin is None or sys.stdin.isatty():
            raise click.UsageError("give a PROMPT argument or pipe the prompt on standard input")
        prompt = _read_stdin()
        if not prompt.strip():
            raise click.UsageError("standard input was empty: pipe a prompt, or give a PROMPT argument")
    elif (piped := _piped_input()) is not None:
        prompt = f"{piped} {prompt}"  # `cat file | generate M "explain this"`: the file, then the ask, as `ollama run`
    target_model = apply_preset(resolve_model(target, models_dir), preset)
    if not raw and suffix is None and (warning := template_warning(target_model, "use --raw to continue the text")):
        click.echo(f"warning: {warning}", err=True)
    draft_model = resolve_draft(draft, models_dir, target_model)
    settings = engine_settings(target_model.params, options)
    history = target_model.messages if not raw else ()  # Ollama prepends a model's MESSAGE history
    request = request_settings(
        target_model,
        options,
        prompt=prompt,
        messages=(*history, ChatMessage("user", prompt)) if history else (),
        system=system,
        raw=raw,
        suffix=suffix,
    )
    speculative = draft_model is not None or named_source(draft) is not None
    if compare and not speculative:
        raise click.UsageError("--compare needs --draft")
    check_draft_flags(
        show_draft=show_draft, ngram=options["with_ngram"], speculative=speculative, draft_model=draft_model
    )
    colour, runs = show_draft and not as_json and colour_on(), [] if show_draft and as_json else None
    if compare and (busy := busy_machine_note()) is not None:
        click.echo(f"note: {busy}", err=True)
    if (warning := unused_gpu_warning()) is not None:
        click.echo(f"warning: {warning}", err=True)
    loading = " and ".join(model.name for model in (target_model, draft_model) if model is not None)
    with notice.ticking(f"loading {loading}"):  # a large model's load is silent in llama.cpp
        engine = Engine(target_model, draft_model, settings, notice=notice)
    with engine:
        baseline = _run_baseline(engine, request, as_json) if compare else None
        if show_draft and not as_json:
            click.echo(legend(colour), err=True)
        # compared: the run's target batches are kept, to replay a greedy difference as it batched
        traced = replace(request, trace_batches=True) if baseline is not None else request
        result = _stream(engine.generate(traced), quiet=as_json, colour=colour, runs=runs)
        margins, batch_size, replayed = [], None, False
        if baseline is not None and request.sampling.greedy and baseline.tokens != result.tokens:
            prompt = engine.prompt_tokens(request)
            margins = engine.greedy_margins(prompt, baseline.tokens, request=request)
            at = first_difference(baseline.tokens, result.tokens)
            if at < min(len(margins), len(result.tokens)) and margins[at] >= NEAR_TIE_LOGITS:
                token = result.tokens[at]
                batch_size = engine.chosen_in_a_batch(prompt, baseline.tokens, at, token, request=request)
                replayed = batch_size is None and engine.chosen_as_batched(
                    prompt, baseline.tokens, result.speculation.batches or (), at, token, request=request
                )
        n_ctx = engine.target.n_ctx
    if as_json:
        data = result_json(target_model.name, draft_model.name if draft_model else named_source(draft), result)
        if runs is not None:
            data["draft_spans"] = drafted_spans(runs)
        if baseline is not None:
            data["baseline"] = result_json(target_model.name, None, baseline)
            data["speedup"] = speedup(baseline, result)
        click.echo(json.dumps(data, indent=2))
        return
    click.echo()
    sys.stdout.flush()
    if baseline is not None:
        click.echo(
            format_comparison(
                baseline,
                result,
                greedy=request.sampling.greedy,
                margins=margins,
                batch_size=batch_size,
                replayed=replayed,
            ),
            err=True,
        )
    if result.finish_reason == "context":
        click.echo(f"stopped: the context ({n_ctx} tokens) is full; raise --ctx for longer output", err=True)
    if stats:
        click.echo(format_stats(result, speculative=speculative), err=True)


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


def speedup(baseline: Result, result: Result) -> float | None:
    """The drafted run's decode speed over the target alone's; None when either wrote too little to time."""
    if baseline.tokens_per_second <= 0 or result.tokens_per_second <= 0:
        return None
    return round(result.tokens_per_second / baseline.tokens_per_second, 3)


def busy_machine_note() -> str | None:
    """Other work on the CPUs skews a one-shot comparison: say so (bench interleaves its runs instead)."""
    if not hasattr(os, "getloadavg"):
        return None  # not on Windows
    load, cores = os.getloadavg()[0], os.cpu_count() or 1
    if load < 0.5 * cores:
        return None
    return (
        f"this machine is busy (load average {load:.1f} on {cores} cores): one run each is a noisy "
        "comparison; 'bench' interleaves several"
    )


def format_comparison(
    baseline: Result,
    result: Result,
    *,
    greedy: bool,
    margins: list[float] = (),
    batch_size: int | None = None,
    replayed: bool = False,
) -> str:
    """Both speeds, the speed-up, and for greedy runs whether the outputs agree; where they part, whether
    rounding explains it (a near-tie; `batch_size`: a batch in which the target itself picks the
    speculative token, see Engine.chosen_in_a_batch; `replayed`: the target picks it on a cache built
    in the run's own batches, see Engine.chosen_as_batched)."""
    ratio = speedup(baseline, result)
    spec = result.speculation
    told = f"speed-up {ratio:.2f}x" if ratio is not None else "no speed-up to tell (a run wrote under 2 tokens)"
    lines = [
        f"target alone:   {baseline.tokens_per_second:7.1f} tok/s ({len(baseline.tokens)} tokens)",
        f"target + draft: {result.tokens_per_second:7.1f} tok/s ({len(result.tokens)} tokens)",
        (
            f"{told}, {spec.acceptance_rate:.0%} of drafted tokens accepted, "
            f"{spec.mean_accepted_per_step:.2f} tokens per target pass"
        ),
    ]
    if greedy and baseline.tokens == result.tokens:
        lines.append("outputs are token-identical")
    elif greedy:
        at = first_difference(baseline.tokens, result.tokens)
        margin = margins[at] if at is not None and at < len(margins) else None
        if margin is not None and margin < NEAR_TIE_LOGITS:
            lines.append(
                f"outputs part at token {at}, where the target's two best logits are {margin:.4f} apart: "
                "a floating-point near-tie between batch sizes, not a verification error"
            )
        elif batch_size is not None:
            lines.append(
                f"outputs part at token {at}, where the target itself picks the speculative token in a "
                f"batch of {batch_size} (logit margin {margin:.3f}): llama.cpp rounds a batch differently "
                "from a single token, not a verification error"
            )
        elif replayed:
            lines.append(
                f"outputs part at token {at}, where the target itself picks the speculative token on a cache "
                f"built in this run's own batches (logit margin {margin:.3f}): llama.cpp rounds cells read in a "
                "batch differently from cells read one at a time, not a verification error"
            )
        else:
            lines.append(f"WARNING: outputs differ from token {at} on")
    return "\n".join(lines)


def result_json(target: str, draft: str | None, result: Result) -> dict:
    spec = result.speculation
    return {
        "target": target,
        "draft": draft,
        "text": result.text,
        "finish_reason": result.finish_reason,
        "prompt_tokens": result.prompt_tokens,
        "generated_tokens": len(result.tokens),
        "tokens_per_second": round(result.tokens_per_second, 3),
        "time_to_first_token_s": round(result.first_token_seconds, 4),
        "total_s": round(result.total_seconds, 4),
        "steps": spec.steps,
        "drafted": spec.drafted,
        "accepted": spec.accepted,
        "acceptance_rate": round(spec.acceptance_rate, 4),
        "mean_tokens_per_step": round(spec.mean_accepted_per_step, 3),
        "acceptance_by_position": [
            round(a / d, 4) for a, d in zip(spec.accepted_by_position, spec.drafted_by_position)
        ],
        "alpha": None if spec.alpha is None else round(spec.alpha, 4),
        "k_chosen": {str(k): n for k, n in sorted(spec.k_chosen.items())},
        "draft_s": round(spec.draft_seconds, 4),
        "verify_s": round(spec.verify_seconds, 4),
    }


def format_stats(result: Result, *, speculative: bool) -> str:
    spec = result.speculation
    lines = [
        # the rate counts the tokens after the first (Ollama's "eval rate"); the first waits on the prompt
        (
            f"{len(result.tokens)} tokens in {result.total_seconds:.2f} s (decode {result.tokens_per_second:.1f} tok/s "
            f"after a {result.first_token_seconds:.2f} s first token; prompt {result.prompt_tokens} tokens; "
            f"finished: {result.finish_reason})"
        )
    ]
    if speculative:
        by_position = " ".join(f"{a / d:.0%}" for a, d in zip(spec.accepted_by_position, spec.drafted_by_position))
        lines.append(
            f"drafted {spec.drafted}, accepted {spec.accepted} ({spec.acceptance_rate:.0%}); "
            f"{spec.mean_accepted_per_step:.2f} tokens per target pass; by position: {by_position}"
        )
        chosen = ", ".join(f"K={k} ×{n}" for k, n in sorted(spec.k_chosen.items()))
        lines.append(f"tokens drafted per step: {chosen}; α (accepted / tried) {spec.alpha or 0:.2f}")
        if len(spec.drafted_by_source) > 1:  # --ngram beside a draft model: who proposed what was accepted
            sources = ", ".join(
                f"{source} {spec.accepted_by_source[source]} of {drafted}"
                for source, drafted in sorted(spec.drafted_by_source.items())
            )
            lines.append(f"accepted by source: {sources}")
        lines.append(f"time: draft {spec.draft_seconds:.2f} s, verify {spec.verify_seconds:.2f} s")
    return "\n".join(lines)
