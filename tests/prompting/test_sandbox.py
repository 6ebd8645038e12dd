"""Chat templates are code from the model file: they render in a child process, bounded in time,
memory and output, and a template that would run forever or fill the memory is one clear error."""

import time

import pytest

from ollama_spec.errors import InvalidSetting
from ollama_spec.prompting.sandbox import Sandbox, TemplateLimits, TemplateRefused, TemplateTooCostly
from ollama_spec.prompting.template import render_chat

NESTED_LOOPS = (
    "{% for i in range(100000) %}{% for j in range(100000) %}{% if j == -1 %}x{% endif %}{% endfor %}{% endfor %}"
)
DOUBLING = '{% set ns = namespace(s="x") %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s }}'
USER = [{"role": "user", "content": "Hi"}]


@pytest.fixture
def sandbox():
    sandbox = Sandbox()
    yield sandbox
    sandbox.close()


def test_a_template_renders_with_its_context(sandbox):
    text = sandbox.render(
        "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}",
        {"messages": USER, "bos_token": "<s>"},
        TemplateLimits(),
    )
    assert text == "<s>[user] Hi"


def test_a_template_that_runs_forever_is_stopped_in_time(sandbox):
    started = time.monotonic()
    with pytest.raises(TemplateTooCostly, match="longer than 0.5 s"):
        sandbox.render(NESTED_LOOPS, {}, TemplateLimits(seconds=0.5))
    assert time.monotonic() - started < 3
    assert sandbox.render("still {{ 'here' }}", {}, TemplateLimits()) == "still here"  # the next render works


def test_a_template_that_fills_the_memory_is_stopped(sandbox):
    with pytest.raises(TemplateTooCostly, match="memory"):
        sandbox.render(DOUBLING, {}, TemplateLimits(memory_mib=256))
    with pytest.raises(TemplateTooCostly, match="memory"):
        sandbox.render("{{ 'x' * 100000000000 }}", {}, TemplateLimits(memory_mib=256))
    assert sandbox.render("ok", {}, TemplateLimits()) == "ok"


def test_a_template_that_writes_too_much_is_stopped(sandbox):
    with pytest.raises(TemplateTooCostly, match="more than 1,000"):
        sandbox.render("{{ 'x' * 1001 }}", {}, TemplateLimits(max_chars=1000))
    assert sandbox.render("{{ 'x' * 1000 }}", {}, TemplateLimits(max_chars=1000)) == "x" * 1000


def test_the_templates_own_refusal_is_told_apart(sandbox):
    with pytest.raises(TemplateRefused, match="no system role"):
        sandbox.render("{{ raise_exception('no system role') }}", {}, TemplateLimits())


def test_a_killed_renderer_is_started_again(sandbox):
    assert sandbox.render("a", {}, TemplateLimits()) == "a"
    sandbox._child.kill()
    sandbox._child.wait()
    assert sandbox.render("b", {}, TemplateLimits()) == "b"


def test_render_chat_says_what_to_do(monkeypatch):
    monkeypatch.setenv("OLLAMA_SPEC_TEMPLATE_TIMEOUT", "0.3")
    with pytest.raises(InvalidSetting) as error:
        render_chat(NESTED_LOOPS, USER, bos_token="", eos_token="")
    assert str(error.value) == (
        "the model's chat template took longer than 0.3 s to render, so it was stopped; fix "
        "the template (or give $OLLAMA_SPEC_TEMPLATE_TIMEOUT more seconds), or use --raw"
    )
    monkeypatch.setenv("OLLAMA_SPEC_TEMPLATE_TIMEOUT", "soon")
    with pytest.raises(InvalidSetting, match="must be a positive number of seconds, got 'soon'"):
        render_chat("x", USER, bos_token="", eos_token="")


def test_surrogates_from_a_terminal_survive_the_trip():
    """Bytes a terminal could not decode arrive as lone surrogates (surrogateescape): they pass through."""
    assert (
        render_chat("{{ messages[0].content }}", [{"role": "user", "content": "a\udcffb"}], bos_token="", eos_token="")
        == "a\udcffb"
    )


def test_the_cli_says_it_in_one_line(invoke, tiny_store, tmp_path, monkeypatch):
    """A Modelfile TEMPLATE (or a GGUF's) that loops: generate ends with one line and exit 1."""
    monkeypatch.setenv("OLLAMA_SPEC_TEMPLATE_TIMEOUT", "0.5")
    preset = tmp_path / "loops.Modelfile"
    preset.write_text(f'FROM tiny-target\nTEMPLATE """{NESTED_LOOPS}"""\n')
    result = invoke(
        "generate", "-f", preset, "Hello", "-n", "4", "--threads", "1", "--no-check", "--models-dir", tiny_store
    )
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        (
            "Error: the model's chat template took longer than 0.5 s to render, so it was stopped; fix the template (or "
            "give $OLLAMA_SPEC_TEMPLATE_TIMEOUT more seconds), or use --raw"
        )
    ]
