"""Splitting a thinking model's answer into its thinking and its content, however the text is streamed."""

import pytest

from ollama_spec.prompting.thinking import ThinkingSplit, opened_by_prompt, template_thinks

CASES = [
    # text, opened by the prompt, (thinking, content)
    ("<think>Let me see.</think>\n\nThe answer.", False, ("Let me see.", "The answer.")),
    ("  <think>\nx</think>y", False, ("x", "y")),
    ("A plain answer", False, ("", "A plain answer")),
    ("<b>bold</b> is not a tag of ours", False, ("", "<b>bold</b> is not a tag of ours")),
    ("\nreasoning first</think> then the answer", True, ("reasoning first", "then the answer")),
    ("thinking to the end </thi", True, ("thinking to the end </thi", "")),
    ("<think>\n\n</think>\n\nAt once.", False, ("", "At once.")),
    ("<th", False, ("", "<th")),
    ("", False, ("", "")),
]


def split(text, opened, size):
    parts = ThinkingSplit(thinking=opened)
    thinking = content = ""
    for start in range(0, len(text), size):
        a, b = parts.push(text[start : start + size])
        thinking, content = thinking + a, content + b
    a, b = parts.finish()
    return thinking + a, content + b


@pytest.mark.parametrize("text, opened, expected", CASES)
def test_the_same_split_however_the_text_arrives(text, opened, expected):
    for size in (1, 2, 3, 7, 1000):
        assert split(text, opened, size) == expected, size


def test_nothing_that_may_be_a_tag_is_sent_early():
    parts = ThinkingSplit()
    assert parts.push("  <thi") == ("", "")  # may still open a thinking block
    assert parts.push("nk>abc</th") == ("abc", "")  # "</th" may still close it
    assert parts.push("ink> ok") == ("", "ok")


def test_which_templates_think_and_which_prompts_open_the_block():
    assert template_thinks("{% if x %}<think>\\n\\n</think>{% endif %}")
    assert not template_thinks("<|im_start|>assistant") and not template_thinks(None)
    assert opened_by_prompt("<|Assistant|><think>\n") and not opened_by_prompt("<think>\n\n</think>\n\n")
