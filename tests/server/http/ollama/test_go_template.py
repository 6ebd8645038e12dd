"""The Go-template subset of /api/generate's `template`: rendered as Go renders it, or refused by name."""

import pytest

from ollama_spec.errors import InvalidSetting
from ollama_spec.server.http.ollama.go_template import render

CHATML = (
    "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}<|im_start|>user\n{{ .Prompt }}"
    "<|im_end|>\n<|im_start|>assistant\n{{ .Response }}<|im_end|>\n"
)


def test_fields_and_conditions():
    assert render("{{ .Prompt }}", prompt="Hi", system="") == "Hi"
    assert (
        render(CHATML, prompt="Hi", system="Be brief.")
        == "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render(CHATML, prompt="Hi", system="") == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert render("{{if .System}}S{{else}}none{{end}}: {{.Prompt}}", prompt="p", system="") == "none: p"


def test_response_cuts_the_template_as_ollama_does():
    """Everything after {{ .Response }} goes, open blocks included: the answer is written there."""
    assert render("A: {{ .Response }} B {{ .Prompt }}", prompt="p", system="") == "A: "
    assert render("{{ if .Prompt }}Q {{ .Response }} rest{{ end }} tail", prompt="p", system="") == "Q "


def test_trim_markers_drop_the_whitespace_beside_an_action():
    assert render("a  \n{{- .Prompt -}}\n  b", prompt="P", system="") == "aPb"
    assert render("{{ .Prompt }} - {{ .System }}", prompt="x", system="y") == "x - y"  # a dash in text stays


def test_values_are_never_read_as_template_text():
    assert render("{{ .Prompt }}", prompt="{{ .System }}", system="secret") == "{{ .System }}"


@pytest.mark.parametrize(
    "template",
    [
        "{{ range .Messages }}{{ .Content }}{{ end }}",
        "{{ .Tools }}",
        "{{ if .System }}x",
        "{{ end }}",
        "{{ else }}",
        '{{ template "x" }}',
        "{{ .Prompt | len }}",
    ],
)
def test_anything_else_is_refused(template):
    with pytest.raises(InvalidSetting, match="template"):
        render(template, prompt="p", system="s")


def test_ifs_nest_as_deep_as_the_template_writes_them():
    depth = 50_000
    template = "{{ if .System }}" * depth + "{{ .System }}" + "{{ else }}none{{ end }}" * depth
    assert render(template, prompt="p", system="s") == "s"
    assert render(template, prompt="p", system="") == "none"
