import pytest

from ollama_spec.chat import render_chat
from ollama_spec.errors import InvalidSetting

MESSAGES = [{"role": "user", "content": "hi"}]


def test_renders_a_template():
    text = render_chat("{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}", MESSAGES,
                       bos_token="<s>", eos_token="</s>")
    assert text == "<s>hi"


@pytest.mark.parametrize("template, detail", [
    ("{% if %}", "Expected an expression"),
    ("{{ 1 + 'a' }}", "unsupported operand"),  # TypeError, not a jinja2.TemplateError
    ("{{ messages[5] }}x", None),  # undefined renders as empty: not an error
    ("{{ ().__class__.__bases__ }}", "unsafe"),  # the sandbox holds
])
def test_a_broken_template_from_the_file_is_one_clean_error(template, detail):
    if detail is None:
        assert render_chat(template, MESSAGES, bos_token="", eos_token="") == "x"
        return
    with pytest.raises(InvalidSetting, match=f"the model's chat template cannot be rendered \\(.*{detail}.*\\); use --raw"):
        render_chat(template, MESSAGES, bos_token="", eos_token="")


def test_raise_exception_in_the_template_says_so():
    with pytest.raises(InvalidSetting, match="refused the conversation: no system role"):
        render_chat("{{ raise_exception('no system role') }}", MESSAGES, bos_token="", eos_token="")
