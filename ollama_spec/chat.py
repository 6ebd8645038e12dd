"""Prompt building: the GGUF's Jinja chat template, rendered as llama-cpp-python renders it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import InvalidSetting

if TYPE_CHECKING:
    from .tools import ToolCall

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()  # an assistant's calls to the tools it was offered
    tool_call_id: str | None = None  # a tool message: the call it answers (OpenAI's id)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidSetting(f"unknown message role '{self.role}'; use one of {', '.join(ROLES)}")

    def for_template(self) -> dict[str, Any]:
        """The message as Hugging Face chat templates read it (tool calls with their arguments as objects)."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                     for c in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


def render_chat(template: str, messages: list[dict[str, Any]], *, bos_token: str, eos_token: str,
                tools: list[dict] | None = None, think: bool | None = None) -> str:
    """Render `messages` (and the `tools` offered, if any) with a Hugging Face style chat template,
    ending with the assistant cue. `think` True or False is told to templates that read
    `enable_thinking` (Qwen3); None leaves their default."""

    def raise_exception(message: str) -> None:
        raise InvalidSetting(f"the model's chat template refused the conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
    try:
        return env.from_string(template).render(
            messages=messages,
            tools=tools,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=True,
            raise_exception=raise_exception,
            strftime_now=lambda fmt: datetime.now().strftime(fmt),
            **({} if think is None else {"enable_thinking": think}),
        )
    except InvalidSetting:
        raise
    except Exception as exc:  # noqa: BLE001 - the template is code from the GGUF: any failure is the model's
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise InvalidSetting(f"the model's chat template cannot be rendered ({detail}); use --raw") from None
