"""Prompt building: the GGUF's Jinja chat template, rendered as llama-cpp-python renders it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from .errors import InvalidSetting

ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True)
class ChatMessage:
    role: str
    content: str

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise InvalidSetting(f"unknown message role '{self.role}'; use one of {', '.join(ROLES)}")


def render_chat(template: str, messages: list[dict[str, str]], *, bos_token: str, eos_token: str) -> str:
    """Render `messages` with a Hugging Face style chat template, ending with the assistant cue."""

    def raise_exception(message: str) -> None:
        raise InvalidSetting(f"the model's chat template refused the conversation: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
    try:
        return env.from_string(template).render(
            messages=messages,
            bos_token=bos_token,
            eos_token=eos_token,
            add_generation_prompt=True,
            raise_exception=raise_exception,
            strftime_now=lambda fmt: datetime.now().strftime(fmt),
        )
    except InvalidSetting:
        raise
    except Exception as exc:  # noqa: BLE001 - the template is code from the GGUF: any failure is the model's
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise InvalidSetting(f"the model's chat template cannot be rendered ({detail}); use --raw") from None
