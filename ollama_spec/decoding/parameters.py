"""Parameters into settings: the one precedence every face resolves sampling and speculation by, and the
ranges the settings hold a Modelfile's PARAMETERs to.

A request's options beat the command's flags, which beat the model's Modelfile parameters (its params
layer, with a -f preset's PARAMETER lines laid over it), which beat the defaults: `resolve` merges them,
each layer a mapping by Ollama's parameter names in which a name left out (or None) falls to the layer
below. K is the one value whose None is a choice: `num_speculative_tokens` present as None is `auto`.
generate, chat, bench and serve all call it, so a flag, a PARAMETER or a request option means the same
in each.

`models/modelfile` reads a preset before any settings exist and does not import them; the commands that
take -f hand it `refusal`, so every one of them refuses the same file with the same line (check and vllm
build no sampling settings). The rule is the one these settings hold flags and requests to.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ollama_spec.decoding.loop import MAX_NUM_SPECULATIVE_TOKENS, SpeculationSettings
from ollama_spec.decoding.penalties import MIN_REPEAT_PENALTY, Penalties
from ollama_spec.decoding.proposer_table import DRAFT
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.errors import InvalidSetting

SAMPLING = ("temperature", "top_k", "top_p", "min_p", "seed")  # SamplingSettings' own, named as Ollama's
PENALTIES = tuple(field.name for field in dataclasses.fields(Penalties))  # named as Ollama's, logit_bias too
K = "num_speculative_tokens"  # -k, a preset's PARAMETER; None where given: auto
STORED_K = "draft_num_predict"  # Ollama's own speculation length in a model's params
Layer = Mapping[str, Any]


@dataclass(frozen=True)
class Resolved:
    """What the layers set for every generation: sampling, speculation, the stop strings (the flags' and
    the model's together) and the longest answer (`max_tokens`: the flags' limit, else the model's positive
    num_predict; `unlimited`: the model's num_predict says until the context is full, Ollama's -1 and -2)."""

    sampling: SamplingSettings
    speculation: SpeculationSettings
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None
    unlimited: bool = False


def resolve(
    params: Layer,
    flags: Layer | None = None,
    *,
    proposer: str = DRAFT,
    notice: Callable[[str], None] = lambda text: None,
) -> Resolved:
    """The settings for a model whose Modelfile parameters are `params` under a command's `flags` (Ollama's
    names: temperature, num_speculative_tokens, num_predict, stop...), drafting with the source `proposer`;
    a K past one verify batch is capped, and `notice` told whose K it was."""
    flags = flags or {}
    layers = (flags, params)
    stored = params.get("num_predict")  # Ollama's -1 and -2: until the context is full
    max_tokens = flags.get("num_predict")  # a flag's limit as given: the Request refuses one below 1
    if max_tokens is None and isinstance(stored, int) and stored > 0:
        max_tokens = stored
    return Resolved(
        sampling=sampling_settings(*layers),
        speculation=SpeculationSettings(
            resolve_k(params, flags, notice),
            **_given({"draft_p_min": _first("draft_p_min", layers), "ngram_size": _first("ngram_size", layers)}),
            proposer=proposer,
        ),
        stop=tuple(flags.get("stop") or ()) + tuple(s for s in params.get("stop") or () if isinstance(s, str)),
        max_tokens=max_tokens,
        unlimited=flags.get("num_predict") is None and stored in (-1, -2),
    )


def sampling_settings(*layers: Layer) -> SamplingSettings:
    """Each sampling value and penalty as the first layer that sets it says, else the default."""
    sampling = {name: _first(name, layers) for name in SAMPLING}
    if sampling["top_k"] is not None:
        sampling["top_k"] = int(sampling["top_k"])
    penalties = {name: _first(name, layers) for name in PENALTIES}
    return SamplingSettings(**_given(sampling), penalties=Penalties(**_given(penalties)))


def as_layer(sampling: SamplingSettings) -> dict[str, Any]:
    """Settings already resolved, as the layer a request's options are laid over."""
    fields = {name: getattr(sampling, name) for name in SAMPLING}
    return fields | {name: getattr(sampling.penalties, name) for name in PENALTIES}


def resolve_k(params: Layer, flags: Layer, notice: Callable[[str], None] = lambda text: None) -> int | None:
    """K (None: auto): the flags', else the Modelfile's num_speculative_tokens, else the model's positive
    draft_num_predict, else auto; capped at MAX_NUM_SPECULATIVE_TOKENS with a `notice` naming whose it was."""
    stored = params.get(STORED_K)
    if K in flags:
        k, said = flags[K], "-k"
    elif params.get(K) is not None:
        k, said = params[K], f"the preset's {K}"
    elif isinstance(stored, int) and not isinstance(stored, bool) and stored > 0:
        k, said = stored, f"the model's {STORED_K}"
    else:
        return None
    if isinstance(k, str):  # a Modelfile's num_speculative_tokens auto
        return None
    if k is not None and k > MAX_NUM_SPECULATIVE_TOKENS:
        notice(
            f"{said} {k} is capped to {MAX_NUM_SPECULATIVE_TOKENS} draft tokens per step (one verify batch is "
            f"at most {MAX_NUM_SPECULATIVE_TOKENS + 1} tokens)"
        )
        return MAX_NUM_SPECULATIVE_TOKENS
    return k


def _first(name: str, layers: tuple[Layer, ...]) -> Any:
    """The value of the first layer that sets `name` (not None), else None."""
    return next((layer[name] for layer in layers if layer.get(name) is not None), None)


def _given(values: dict) -> dict:
    """The values set: the settings' own defaults stand for the rest."""
    return {name: value for name, value in values.items() if value is not None}


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
