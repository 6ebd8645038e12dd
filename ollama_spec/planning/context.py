"""The context a served model gets when nobody asked for one: Ollama's rule (server/routes.go, sched.go).

A request's, a preset's or the params layer's num_ctx wins; else OLLAMA_CONTEXT_LENGTH; else 4k, 32k
or 256k tokens by the GPUs' total memory (4k on a CPU). Never above the model's trained length, and
lowered a tier at a time (256k -> 32k -> 4k) while the memory plan says the pair would not fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ollama_spec.config import ollama_var
from ollama_spec.errors import InvalidSetting
from ollama_spec.planning.devices import Device

GIB = 1 << 30
SMALL_CTX, MEDIUM_CTX, LARGE_CTX = 4096, 32768, 262144
# Ollama's thresholds, a little under 24 and 48 GiB "to account for small differences in the exact value"
MEDIUM_VRAM, LARGE_VRAM = 23 * GIB, 47 * GIB


@dataclass(frozen=True)
class ContextChoice:
    """The context to load with, whether it was chosen here (so it may be lowered), and why."""

    n_ctx: int
    auto: bool
    why: str


def tier_for_vram(devices: Sequence[Device]) -> int:
    """Ollama's default context for this much GPU memory (this machine's GPUs, not RPC servers')."""
    total = sum(d.total for d in devices if d.is_gpu and not d.is_remote)
    return LARGE_CTX if total >= LARGE_VRAM else MEDIUM_CTX if total >= MEDIUM_VRAM else SMALL_CTX


def environment_context(environ: Mapping[str, str] | None = None) -> int | None:
    """OLLAMA_CONTEXT_LENGTH, when set (a positive whole number, as Ollama's envconfig.Uint reads it)."""
    text = ollama_var("OLLAMA_CONTEXT_LENGTH", environ)
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise InvalidSetting(f"OLLAMA_CONTEXT_LENGTH must be a positive number of tokens, got {text!r}")
    return int(text)


def choose_context(
    given: int | None,
    trained: int | None,
    devices: Sequence[Device],
    environ: Mapping[str, str] | None = None,
    *,
    flag: int | None = None,
    given_why: str = "asked for",
) -> ContextChoice:
    """The context for a model trained on `trained` tokens: a command's `flag` (--ctx) as it is; else
    `given` (a preset, the params layer, a request: `given_why` says which), else OLLAMA_CONTEXT_LENGTH, else the VRAM tier, capped at
    `trained` as Ollama's runner caps it."""
    if flag is not None:
        return ContextChoice(flag, False, "--ctx")
    if given is not None:
        n_ctx, auto, why = given, False, given_why
    elif (from_env := environment_context(environ)) is not None:
        n_ctx, auto, why = from_env, False, "OLLAMA_CONTEXT_LENGTH"
    else:
        n_ctx, auto = tier_for_vram(devices), True
        why = "Ollama's default for this machine's GPU memory" if n_ctx > SMALL_CTX else "Ollama's default"
    if trained and n_ctx > trained:
        return ContextChoice(trained, auto, f"{why}, capped at the model's trained length")
    return ContextChoice(n_ctx, auto, why)


def lower_context(n_ctx: int) -> int | None:
    """The next tier down (Ollama's nextLowerAutoNumCtx), or None at the smallest."""
    return MEDIUM_CTX if n_ctx > MEDIUM_CTX else SMALL_CTX if n_ctx > SMALL_CTX else None
