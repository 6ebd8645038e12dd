"""A conversation through a chat template, with no model loaded: tools, tool answers, system folding."""

import pytest

from ollama_spec.errors import InvalidSetting
from ollama_spec.prompting.chat import chat_text
from ollama_spec.prompting.messages import ChatMessage

NO_SYSTEM_ROLE = (
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}"
    "{{ raise_exception('System role not supported') }}{% endif %}"
    "<{{ m.role }}>{{ m.content }}{{ eos_token }}{% endfor %}<assistant>"
)


def test_without_a_template_there_is_no_chat_text():
    assert chat_text(None, [ChatMessage("user", "Hi")]) is None
    assert chat_text("", [ChatMessage("user", "Hi")]) is None


def test_the_special_token_texts_reach_the_template_and_a_refused_system_role_is_folded():
    messages = [ChatMessage("system", "Be brief."), ChatMessage("user", "Hi")]
    text = chat_text(NO_SYSTEM_ROLE, messages, bos_token="<s>", eos_token="</s>")
    assert text == "<s><user>Be brief.\n\nHi</s><assistant>"


def test_a_refusal_with_no_system_message_to_fold_stays_a_refusal():
    refuses = "{{ raise_exception('no') }}"
    with pytest.raises(InvalidSetting, match="refused the conversation: no"):
        chat_text(refuses, [ChatMessage("user", "Hi")])


def test_tools_go_into_the_messages_when_the_template_takes_none():
    plain = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    tool = {"type": "function", "function": {"name": "now", "description": "the time", "parameters": {}}}
    text = chat_text(plain, [ChatMessage("user", "What time is it?")], [tool])
    assert '"now"' in text and "What time is it?" in text
