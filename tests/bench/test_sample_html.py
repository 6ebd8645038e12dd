"""`sample.html`: which sample it shows, the draft's text marked, everything escaped."""

from ollama_spec.bench.prompts import Prompt
from ollama_spec.bench.sample_html import sample_page, shown_sample
from ollama_spec.bench.samples import BASELINE, SPECULATIVE, Row, Sample
from ollama_spec.prompting.text_stream import Run

RUNS = (Run("if a ", False), Run("<", True), Run(" b", True), Run(" & c:", False), Run("\n    return", True))


def spec_sample(runs=RUNS) -> Sample:
    return Sample("code", 0, [1] * 9, 0.1, 1.0, steps=4, drafted=8, accepted=5, runs=runs)


def test_the_page_marks_the_drafts_text_escaped_with_the_numbers_and_a_legend():
    row = Row("speculative K=3", SPECULATIVE, 3, [spec_sample()])
    page = sample_page("t<1>", "d", row, row.samples[0], Prompt("code", "Compare <a> & <b>"))
    body = page.split("<pre>")[1].split("</pre>")[0]
    # adjacent drafted runs make one mark; < and & are escaped, in the text and the prompt alike
    assert body == 'if a <mark class="draft">&lt; b</mark> &amp; c:<mark class="draft">\n    return</mark>'
    assert "Compare &lt;a&gt; &amp; &lt;b&gt;" in page and "t&lt;1&gt; drafted by d" in page
    assert "5 of 8 drafted tokens (62%)" in page and "(2.25 per pass)" in page
    assert "proposed by the draft and accepted by the target" in page
    assert page.startswith("<!DOCTYPE html>") and "<script" not in page


def test_the_best_rows_sample_is_shown_else_any_speculative_rows():
    kept, other = Row("K=3", SPECULATIVE, 3, [spec_sample()]), Row("K=1", SPECULATIVE, 1, [spec_sample(())])
    baseline = Row("target alone", BASELINE, samples=[Sample("code", 0, [1], 0, 1)])
    assert shown_sample([baseline, other, kept], best=kept) == (kept, kept.samples[0])
    assert shown_sample([baseline, other, kept], best=other) == (kept, kept.samples[0])
    assert shown_sample([baseline, other]) is None
