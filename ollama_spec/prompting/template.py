"""Prompt building: the GGUF's Jinja chat template, rendered as transformers renders it (its loop
controls, its `tojson`, its `generation` tag), in a sandboxed child process (sandbox.py)."""

from __future__ import annotations

from typing import Any

from ollama_spec.errors import InvalidSetting
from ollama_spec.prompting.sandbox import (
    TIMEOUT_ENV,
    TemplateFailed,
    TemplateLimits,
    TemplateTooCostly,
    render_in_sandbox,
)
from ollama_spec.prompting.sandbox import TemplateRefused as TemplateDeclined


class TemplateRefused(InvalidSetting):
    """The template's own raise_exception: it will not render this conversation as it is."""


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    bos_token: str,
    eos_token: str,
    tools: list[dict] | None = None,
    think: bool | None = None,
    limits: TemplateLimits | None = None,
) -> str:
    """Render `messages` (and the `tools` offered, if any) with a Hugging Face style chat template,
    ending with the assistant cue, in the template sandbox (bounded by `limits`, by default
    TemplateLimits.from_environment()). `think` True or False is told to templates that read
    `enable_thinking` (Qwen3); None leaves their default."""
    try:
        limits = limits or TemplateLimits.from_environment()
    except ValueError as exc:
        raise InvalidSetting(str(exc)) from None
    context = {
        "messages": messages,
        "bos_token": bos_token,
        "eos_token": eos_token,
        "add_generation_prompt": True,
        **({"tools": tools} if tools else {}),  # undefined when none: "tool_use" templates loop over it
        **({} if think is None else {"enable_thinking": think}),
    }
    try:
        return render_in_sandbox(template, context, limits)
    except TemplateDeclined as exc:
        raise TemplateRefused(f"the model's chat template refused the conversation: {exc}") from None
    except TemplateTooCostly as exc:
        more_time = f" (or give ${TIMEOUT_ENV} more seconds)" if "longer than" in str(exc) else ""
        raise InvalidSetting(
            f"the model's chat template {exc}, so it was stopped; fix the template{more_time}, or use --raw"
        ) from None
    except TemplateFailed as exc:
        raise InvalidSetting(f"the model's chat template cannot be rendered ({exc}); use --raw") from None
