"""The ranges the settings hold a Modelfile's PARAMETERs to, said as a preset's error says them.

`models/modelfile` reads a preset before any settings exist and does not import them; the commands that
take -f hand it `refusal`, so every one of them refuses the same file with the same line (check and vllm
build no sampling settings). The rule is the one these settings hold flags and requests to.
"""

from __future__ import annotations

from typing import Any

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.penalties import MIN_REPEAT_PENALTY, Penalties
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.errors import InvalidSetting

# PARAMETER name -> (the settings whose field of that name it becomes, what the error says it must be)
RANGES: dict[str, tuple[type, str]] = {
    "temperature": (SamplingSettings, ">= 0"),
    "top_k": (SamplingSettings, ">= 0 (0 turns it off)"),
    "top_p": (SamplingSettings, "in (0, 1]"),
    "min_p": (SamplingSettings, "in [0, 1]"),
    "draft_p_min": (SpeculationSettings, "in [0, 1)"),
    "repeat_penalty": (Penalties, f"in {MIN_REPEAT_PENALTY:g}..{1 / MIN_REPEAT_PENALTY:g} (1 turns it off)"),
    "repeat_last_n": (Penalties, "-1 (the whole text), 0 (off) or more"),
    "presence_penalty": (Penalties, "a finite number"),
    "frequency_penalty": (Penalties, "a finite number"),
}


def refusal(name: str, value: Any) -> str | None:
    """What PARAMETER `name` must be, where its settings refuse `value` (already typed); None where they
    take it, or where no settings hold it to a range."""
    if name not in RANGES:
        return None
    settings, within = RANGES[name]
    try:
        settings(**{name: value})
    except InvalidSetting:
        return within
    return None
