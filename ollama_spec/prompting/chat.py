"""A conversation as the text a model's chat template makes of it: the tools offered (written into
the messages when the template takes none), tool answers named, and system messages folded into
the first user turn when the template refuses a system role."""

from __future__ import annotations

from collections.abc import Sequence

from ollama_spec.prompting.messages import ChatMessage, name_tool_answers, system_folded
from ollama_spec.prompting.template import TemplateRefused, render_chat
from ollama_spec.prompting.tools import template_takes_tools, tools_in_messages


def chat_text(
    template: str | None,
    messages: list[ChatMessage],
    tools: Sequence[dict] = (),
    think: bool | None = None,
    *,
    bos_token: str = "",
    eos_token: str = "",
) -> str | None:
    """`messages` (and the `tools` offered) through the chat `template`, ending with the assistant's
    cue; None without a template. `bos_token` and `eos_token` are the model's texts for them."""
    if not template:
        return None

    def render(conversation: list[ChatMessage]) -> str:
        return render_chat(
            template,
            [m.for_template() for m in name_tool_answers(conversation)],
            bos_token=bos_token,
            eos_token=eos_token,
            tools=list(tools) or None,
            think=think,
        )

    if tools and not template_takes_tools(template):
        messages, tools = tools_in_messages(messages, list(tools)), ()
    try:
        return render(messages)
    except TemplateRefused:
        folded = system_folded(messages)
        if folded is None:
            raise
        return render(folded)
