"""`sample.html`: one prompt's speculative output, the text accepted from the draft highlighted."""

from __future__ import annotations

import html
from collections.abc import Sequence

from ollama_spec.bench.prompts import Prompt
from ollama_spec.bench.samples import SPECULATIVE, Row, Sample
from ollama_spec.prompting.text_stream import merge_runs

STYLE = """body { font-family: system-ui, sans-serif; max-width: 50rem; margin: 2rem auto; padding: 0 1rem; }
pre { white-space: pre-wrap; font: 0.95rem/1.5 ui-monospace, monospace; padding: 1rem; border: 1px solid #ccc; }
mark.draft { background: #c8f0c8; color: inherit; }
dt { font-weight: 600; } dd { margin: 0 0 0.4rem 0; }"""


def shown_sample(rows: Sequence[Row], best: Row | None = None) -> tuple[Row, Sample] | None:
    """The row and sample to show: `best`'s kept sample, else the first speculative row's that has one."""
    ordered = ([best] if best is not None else []) + [r for r in rows if r.kind == SPECULATIVE] + list(rows)
    for row in ordered:
        for sample in row.samples:
            if sample.runs:
                return row, sample
    return None


def sample_page(target: str, draft: str, row: Row, sample: Sample, prompt: Prompt | None) -> str:
    """The page: who wrote it, the prompt, the acceptance numbers, a legend, and the text with each
    stretch the draft proposed (and the target accepted) in a <mark>. Everything shown is escaped."""
    text = "".join(
        f'<mark class="draft">{html.escape(run.text)}</mark>' if run.from_draft else html.escape(run.text)
        for run in merge_runs(sample.runs)
    )
    drafted_chars = sum(len(run.text) for run in sample.runs if run.from_draft)
    total_chars = sum(len(run.text) for run in sample.runs)
    rate = f"{sample.accepted / sample.drafted:.0%}" if sample.drafted else "–"
    per_step = f"{(sample.accepted + sample.steps) / sample.steps:.2f}" if sample.steps else "–"
    facts = [
        ("pair", f"{target} drafted by {draft}"),
        ("row", row.label),
        ("prompt", f"{sample.prompt}: {prompt.prompt}" if prompt is not None else sample.prompt),
        ("tokens", f"{len(sample.tokens)} generated in {sample.steps} target passes ({per_step} per pass)"),
        ("accepted", f"{sample.accepted} of {sample.drafted} drafted tokens ({rate})"),
        ("from the draft", f"{drafted_chars} of {total_chars} characters" if total_chars else "–"),
    ]
    details = "\n".join(f"<dt>{html.escape(name)}</dt><dd>{html.escape(value)}</dd>" for name, value in facts)
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>Speculative sample: {html.escape(target)}</title>
<style>
{STYLE}
</style>
</head>
<body>
<h1>Speculative sample</h1>
<dl>
{details}
</dl>
<p><mark class="draft">highlighted</mark>: proposed by the draft and accepted by the target;
plain: the target's own tokens (a rejected draft's correction, and the token after each accepted run).</p>
<pre>{text}</pre>
</body>
</html>
"""
