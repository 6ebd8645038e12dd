"""Protocol models both APIs share, where their wire formats are the same: a request's nulls, and the
tool calls of an earlier answer that a client sends back in the history."""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
from pydantic import BaseModel, ConfigDict, model_validator

from ollama_spec.prompting.messages import ToolCall

# how deep a request body's arrays and objects may nest (http/bodies.py says why); tool calls' arguments too
MAX_NESTING = 100
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"')  # a JSON string, escapes included
_NOT_BRACKETS = bytes(i for i in range(256) if i not in b"[]{}")


def nesting(body: bytes) -> int:
    """How deep arrays and objects nest in JSON text; brackets inside strings do not count."""
    brackets = np.frombuffer(_STRING.sub(b"", body).translate(None, _NOT_BRACKETS), np.uint8)
    steps = np.where((brackets == ord("[")) | (brackets == ord("{")), 1, -1)
    return int(steps.cumsum().max(initial=0))


class NullsAsDefaults(BaseModel):
    """A request whose JSON nulls leave the fields' defaults, as Go's decoder leaves Ollama's and as
    OpenAI's optional fields read them (clients such as LiteLLM send every unset field as null)."""

    @model_validator(mode="before")
    @classmethod
    def _without_nulls(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class FunctionCall(BaseModel):
    """The function an earlier answer called: its arguments as JSON text (OpenAI's) or an object."""

    model_config = ConfigDict(extra="ignore")  # Ollama's index

    name: str
    arguments: str | dict = "{}"


class ToolCallIn(BaseModel):
    """A call of an earlier answer, as the history sends it back."""

    model_config = ConfigDict(extra="ignore")  # type

    id: str | None = None  # the id a tool's answer refers to it by
    function: FunctionCall

    def to_call(self) -> ToolCall:
        return ToolCall(self.function.name, tool_arguments(self.function.arguments), self.id)


def tool_arguments(arguments: str | dict) -> dict | str:
    """A call's arguments from the history: a JSON object as the object (what chat templates read);
    anything else as the text the model wrote (a call cut short, or not JSON at all), which the
    client sends back with its answer that the call was invalid. Templates take such text as
    transformers passes it, a string; so is JSON nested deeper than a request body may be (the body's
    check sees only a string), which Python's decoder and the templates could not walk."""
    if isinstance(arguments, dict):
        return arguments
    if nesting(arguments.encode("utf-8", "surrogatepass")) > MAX_NESTING:
        return arguments
    try:
        value = json.loads(arguments or "{}")
    except json.JSONDecodeError:
        return arguments
    return value if isinstance(value, dict) else arguments


def chat_role(role: str) -> str:
    """A message's role as the templates know it: developer is OpenAI's newer name for system."""
    return "system" if role == "developer" else role
