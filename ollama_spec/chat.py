"""Prompt building: the GGUF's Jinja chat template, rendered as transformers renders it (its loop
controls, its `tojson`, its `generation` tag), in a sandbox."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any

import jinja2
import jinja2.ext
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
    tool_name: str | None = None  # a tool message: the tool that answered (Ollama's tool_name)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidSetting(f"unknown message role '{self.role}'; use one of {', '.join(ROLES)}")

    def for_template(self) -> dict[str, Any]:
        """The message as Hugging Face chat templates read it (tool calls with their arguments as objects)."""
        message: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            # ids: Mistral's templates want 9 letters or digits, Gemma's match answers to calls by them
            message["tool_calls"] = [{"id": c.id or f"{i:09d}", "type": "function",
                                      "function": {"name": c.name, "arguments": c.arguments}}
                                     for i, c in enumerate(self.tool_calls)]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_name is not None:
            message["name"] = self.tool_name
        return message


def name_tool_answers(messages: list[ChatMessage]) -> list[ChatMessage]:
    """Tool messages with the name of the tool that answered, where the client left it out: the call
    with their id, else the one call before them. (Templates print it: Gemma's fail without it.)"""
    named, calls = [], {}
    for message in messages:
        for call in message.tool_calls:
            calls[call.id] = call.name
        if message.role == "tool" and message.tool_name is None:
            name = calls.get(message.tool_call_id) if message.tool_call_id else None
            if name is None and len(calls) == 1:
                name = next(iter(calls.values()))
            if name is not None:
                message = replace(message, tool_name=name)
        if message.role == "user":
            calls = {}
        named.append(message)
    return named


class TemplateRefused(InvalidSetting):
    """The template's own raise_exception: it will not render this conversation as it is."""


def system_folded(messages: list[ChatMessage]) -> list[ChatMessage] | None:
    """The system messages put at the start of the first user message, for templates with no system
    role (Gemma's refuse one), as Ollama's own templates for such models do; None when there is none."""
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    rest = [m for m in messages if m.role != "system"]
    if len(rest) == len(messages):
        return None
    first_user = next((i for i, m in enumerate(rest) if m.role == "user"), None)
    if system and first_user is not None:
        rest[first_user] = replace(rest[first_user], content=f"{system}\n\n{rest[first_user].content}")
    return rest


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}`, which transformers' renderer knows (it marks the assistant's
    part for training masks): its body renders as it is."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    """transformers' `tojson`: templates pass json.dumps's arguments (GLM, MiniMax) and expect text unescaped."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def render_chat(template: str, messages: list[dict[str, Any]], *, bos_token: str, eos_token: str,
                tools: list[dict] | None = None, think: bool | None = None) -> str:
    """Render `messages` (and the `tools` offered, if any) with a Hugging Face style chat template,
    ending with the assistant cue. `think` True or False is told to templates that read
    `enable_thinking` (Qwen3); None leaves their default."""

    def raise_exception(message: str) -> None:
        raise TemplateRefused(f"the model's chat template refused the conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader(),
                                        extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(template).render(
            messages=messages,
            **({"tools": tools} if tools else {}),  # undefined when none: "tool_use" templates loop over it
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
