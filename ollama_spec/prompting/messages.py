"""A conversation as the faces hand it over: messages, and the tool calls an assistant made."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ollama_spec.errors import InvalidSetting


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] | str  # from a client's history, the text of a call that was not JSON
    id: str | None = None  # the client's id for it (OpenAI's), which its answer refers to
    # A call cut short by the answer's length: its arguments as far as they were written (not JSON)
    cut_arguments: str | None = None


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
            message["tool_calls"] = [
                {"id": c.id or f"{i:09d}", "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                for i, c in enumerate(self.tool_calls)
            ]
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
