"""`--show-draft` on `generate` and `chat`: drafted text in colour exactly where the draft wrote it,
on a terminal only (CliRunner's color=True stands in for one), never with NO_COLOR."""

import json
import re

import pytest

BASE = ("--threads", "1", "--no-check", "-t", "0", "-k", "3", "-n", "30")
PROMPT = "Write a function that returns the sum"
GREEN, RESET = "\x1b[32m", "\x1b[0m"
LEGEND = f"{GREEN}green{RESET}: accepted from the draft; plain: the target's own tokens"


def gen(invoke, store, *args, **kwargs):
    return invoke("generate", "tiny-target", PROMPT, "-d", "tiny-draft", *BASE, "--models-dir", store, *args, **kwargs)


def marked(text: str, spans) -> str:
    """`text` with the colour put around each span, as --show-draft prints it."""
    out, at = "", 0
    for start, end in spans:
        out += text[at:start] + GREEN + text[start:end] + RESET
        at = end
    return out + text[at:]


def test_drafted_text_is_green_exactly_where_the_draft_wrote_it(invoke, tiny_store):
    shown = gen(invoke, tiny_store, "--show-draft", color=True)
    assert shown.exit_code == 0, shown.output
    data = json.loads(gen(invoke, tiny_store, "--show-draft", "--json").stdout)
    spans = data["draft_spans"]
    assert spans and sum(end - start for start, end in spans) < len(data["text"])  # both models wrote some
    # Runs released by separate tokens are coloured one by one: a colour that ends where the next begins is one span.
    assert shown.stdout.replace(RESET + GREEN, "") == marked(data["text"], spans) + "\n"
    assert re.sub(r"\x1b\[\d+m", "", shown.stdout) == gen(invoke, tiny_store).stdout  # the same text, only coloured
    assert LEGEND in shown.stderr


def test_no_colour_when_not_a_terminal_or_with_no_color(invoke, tiny_store, monkeypatch):
    plain = gen(invoke, tiny_store)
    piped = gen(invoke, tiny_store, "--show-draft")
    assert piped.exit_code == 0 and piped.stdout == plain.stdout and "\x1b" not in piped.output
    assert "note: --show-draft colours nothing: standard output is not a terminal" in piped.stderr
    monkeypatch.setenv("NO_COLOR", "1")
    told = gen(invoke, tiny_store, "--show-draft", color=True)
    assert told.stdout == plain.stdout and "\x1b" not in told.output
    assert "note: --show-draft colours nothing: NO_COLOR is set" in told.stderr
    monkeypatch.setenv("NO_COLOR", "")  # no-color.org: only a value that is not empty turns colour off
    assert GREEN in gen(invoke, tiny_store, "--show-draft", color=True).stdout


def test_compare_still_compares_and_colours_only_the_drafted_run(invoke, tiny_store):
    result = gen(invoke, tiny_store, "--show-draft", "--compare", color=True)
    assert result.exit_code == 0, result.output
    alone, drafted = result.stdout.split("\n")[:2]
    assert "\x1b" not in alone and GREEN in drafted and re.sub(r"\x1b\[\d+m", "", drafted) == alone
    assert "outputs are token-identical" in result.stderr and LEGEND in result.stderr
    assert result.stderr.index("--- target + draft ---") < result.stderr.index(LEGEND)


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_show_draft_needs_a_draft(invoke, tiny_store, command):
    args = ("tiny-target", "Hi") if command == "generate" else ("tiny-target",)
    result = invoke(command, *args, "--show-draft", "--models-dir", tiny_store, "--no-check", input="Hi\n")
    assert result.exit_code == 2
    assert "Error: --show-draft needs --draft: without one the target writes every token" in result.stderr


def test_chat_colours_each_answer(invoke, tiny_store):
    args = ("tiny-target", "-d", "tiny-draft", *BASE, "--models-dir", tiny_store)
    plain = invoke("chat", *args, input="Hello there\nAnd again\n")
    shown = invoke("chat", *args, "--show-draft", input="Hello there\nAnd again\n", color=True)
    assert shown.exit_code == 0, shown.output
    answers = shown.stdout.splitlines()
    assert len(answers) == 2 and all(GREEN in a for a in answers)
    assert re.sub(r"\x1b\[\d+m", "", shown.stdout) == plain.stdout
    assert shown.stderr.count(LEGEND) == 1
