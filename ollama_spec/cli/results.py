"""What generate and chat print of a finished generation: its statistics, the comparison with the target
alone (--compare), and --json's object."""

from __future__ import annotations

import os

from ollama_spec.engine.engine import NEAR_TIE_LOGITS, Result, first_difference


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
