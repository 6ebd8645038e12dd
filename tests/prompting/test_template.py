import pytest

from ollama_spec.errors import InvalidSetting
from ollama_spec.prompting.messages import ChatMessage, ToolCall, name_tool_answers, system_folded
from ollama_spec.prompting.template import render_chat

MESSAGES = [{"role": "user", "content": "hi"}]


def test_renders_a_template():
    text = render_chat(
        "{{ bos_token }}{% for m in messages %}{{ m['content'] }}{% endfor %}",
        MESSAGES,
        bos_token="<s>",
        eos_token="</s>",
    )
    assert text == "<s>hi"


@pytest.mark.parametrize(
    "template, detail",
    [
        ("{% if %}", "Expected an expression"),
        ("{{ 1 + 'a' }}", "unsupported operand"),  # TypeError, not a jinja2.TemplateError
        ("{{ messages[5] }}x", None),  # undefined renders as empty: not an error
        ("{{ ().__class__.__bases__ }}", "unsafe"),  # the sandbox holds
    ],
)
def test_a_broken_template_from_the_file_is_one_clean_error(template, detail):
    if detail is None:
        assert render_chat(template, MESSAGES, bos_token="", eos_token="") == "x"
        return
    with pytest.raises(
        InvalidSetting, match=f"the model's chat template cannot be rendered \\(.*{detail}.*\\); use --raw"
    ):
        render_chat(template, MESSAGES, bos_token="", eos_token="")


def test_raise_exception_in_the_template_says_so():
    with pytest.raises(InvalidSetting, match="refused the conversation: no system role"):
        render_chat("{{ raise_exception('no system role') }}", MESSAGES, bos_token="", eos_token="")


def render(template, messages=(), **kwargs):
    return render_chat(template, [m.for_template() for m in messages], bos_token="<s>", eos_token="</s>", **kwargs)


def test_what_transformers_templates_use_renders():
    """Loop controls (Cohere, Kimi), tojson with json.dumps's arguments (GLM, MiniMax), the
    generation tag (LFM2, Laguna): templates that transformers renders render here too."""
    template = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{% generation %}{{ m.content }}{% endgeneration %}{% endfor %}"
        "|{{ tools | tojson(ensure_ascii=False, indent=None, separators=(',', ':'), sort_keys=True) }}"
    )
    out = render(
        template, [ChatMessage("user", "héllo"), ChatMessage("assistant", "never")], tools=[{"b": 1, "a": "é"}]
    )
    assert out == 'héllo|[{"a":"é","b":1}]'


def test_tool_calls_and_answers_as_templates_read_them():
    call = ToolCall("get_weather", {"city": "Paris"})
    messages = name_tool_answers(
        [
            ChatMessage("user", "Weather?"),
            ChatMessage("assistant", "", (call,)),
            ChatMessage("tool", "22 C"),
            ChatMessage("user", "And Oslo?"),
            ChatMessage("assistant", "", (ToolCall("add", {}, "abc123xyz"),)),
            ChatMessage("tool", "3", tool_call_id="abc123xyz"),
        ]
    )
    rendered = [m.for_template() for m in messages]
    assert rendered[1]["tool_calls"] == [
        {"id": "000000000", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    ]
    assert rendered[2]["name"] == "get_weather"  # the one call before it
    assert rendered[5]["name"] == "add" and rendered[5]["tool_call_id"] == "abc123xyz"  # by its id
    assert "name" not in rendered[0] and "tool_calls" not in rendered[0]


def test_a_system_message_is_folded_into_the_first_turn_for_a_template_without_a_system_role():
    messages = [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hello"),
        ChatMessage("user", "Bye"),
    ]
    folded = system_folded(messages)
    assert [m.role for m in folded] == ["user", "assistant", "user"]
    assert folded[0].content == "Be brief.\n\nHi" and folded[2].content == "Bye"
    assert system_folded(messages[1:]) is None


def test_the_engine_folds_the_system_message_when_the_template_refuses_it(tiny_models):
    import dataclasses

    from ollama_spec.engine.engine import Engine, Request
    from tests.conftest import engine_settings

    gemma_like = (
        "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}"
        "{{ raise_exception('System role not supported') }}{% endif %}"
        "<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}<start_of_turn>model\n"
    )
    info = dataclasses.replace(tiny_models[0].info, chat_template=gemma_like)
    target = dataclasses.replace(tiny_models[0], info=info)
    with Engine(target, None, engine_settings()) as engine:
        text = engine.target.detokenize(engine.prompt_tokens(Request("Hi", system="Be brief.")), special=True)
    assert "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>" in text
