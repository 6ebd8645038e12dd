"""A -f preset laid over the model it is FROM: what the commands and the server both run."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ollama_spec.models.modelfile import Modelfile
from ollama_spec.models.resolve import ResolvedModel, lora_adapter


def lay_preset(model: ResolvedModel, preset: Modelfile | None, notice: Callable[[str], None]) -> ResolvedModel:
    """The model with the preset's parameters over its own, and the preset's SYSTEM, MESSAGEs and (Jinja)
    TEMPLATE; what it leaves out is said through `notice` (a command's stderr, the server's log)."""
    if preset is None:
        return model
    info = model.info
    for name in preset.deprecated:
        notice(f"{preset.path}: PARAMETER {name} is one Ollama no longer takes; ignored, as 'ollama create' does")
    if preset.template is not None:
        if "{%" in preset.template or "messages" in preset.template:  # a Hugging Face (Jinja) chat template
            info = dataclasses.replace(info, chat_template=preset.template)
        else:
            notice(f"{preset.path}: TEMPLATE is an Ollama Go template; the model's own chat template is used instead")
    # As `ollama create` does: the file's MESSAGE lines replace the model's own history, if it has any,
    # and its ADAPTER lines add to the model's own adapters.
    adapters = tuple(
        lora_adapter(adapter, model.info, f"{preset.path}: ADAPTER {adapter}") for adapter in preset.adapters
    )
    return dataclasses.replace(
        model,
        info=info,
        params={**model.params, **preset.parameters},
        system=preset.system if preset.system is not None else model.system,
        messages=preset.messages or model.messages,
        adapters=model.adapters + adapters,
    )
