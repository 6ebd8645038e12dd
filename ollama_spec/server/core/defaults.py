"""What `serve`'s sampling and speculation flags set for every request, as data: each field None where no
flag was given. Laid over a model's own params (its params layer, a preset's PARAMETER lines over them),
which fill what the flags leave, then Ollama's defaults; a request's own options beat them all (request.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace

from ollama_spec.decoding.loop import MAX_NUM_SPECULATIVE_TOKENS, SpeculationSettings
from ollama_spec.decoding.penalties import OPTIONS as PENALTY_OPTIONS
from ollama_spec.decoding.penalties import Penalties
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.server.core.settings import ServerSettings

log = logging.getLogger("ollama_spec.server")
AUTO_K = "auto"  # -k auto given: K is chosen each step, whatever the model's draft_num_predict says
SAMPLING = ("temperature", "top_k", "top_p", "min_p", "seed")  # flags named as Ollama's params are


@dataclass(frozen=True)
class RequestDefaults:
    """serve's flags, None where not given. The sampling ones and the penalties are named as Ollama's params."""

    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    num_speculative_tokens: int | str | None = None  # -k: a number, or AUTO_K
    draft_p_min: float | None = None
    ngram_size: int | None = None
    proposer: str | None = None  # "ngram" (--draft ngram), "draft+ngram" (--ngram): the pair's wins

    def over(self, params: Mapping, base: ServerSettings, proposer: str | None = None) -> ServerSettings:
        """`base` with the requests' defaults for a model whose params are `params`, its pair proposing with
        `proposer` ("ngram": --pair's; None: as the flags say): the flags, else the params, else Ollama's
        defaults; the stop strings and num_predict are the model's."""
        sampling = {name: self._chosen(name, params) for name in SAMPLING}
        if sampling["top_k"] is not None:
            sampling["top_k"] = int(sampling["top_k"])
        penalties = {name: self._chosen(name, params) for name in PENALTY_OPTIONS}
        num_predict = params.get("num_predict")
        return replace(
            base,
            sampling=SamplingSettings(**_set(sampling), penalties=Penalties(**_set(penalties))),
            speculation=self._speculation(params, proposer),
            stop=tuple(s for s in params.get("stop", []) if isinstance(s, str)),
            max_tokens=num_predict if isinstance(num_predict, int) and num_predict > 0 else None,
        )

    def _chosen(self, name: str, params: Mapping):
        given = getattr(self, name)
        return given if given is not None else params.get(name)

    def _speculation(self, params: Mapping, proposer: str | None) -> SpeculationSettings:
        k = self.num_speculative_tokens
        if k is None:  # no -k: Ollama's own speculation length for this model, else auto
            stored = params.get("draft_num_predict")
            k = stored if isinstance(stored, int) and stored > 0 else None
        elif k == AUTO_K:
            k = None
        if k is not None and k > MAX_NUM_SPECULATIVE_TOKENS:  # the flag's was capped by the command
            log.info("the model's draft_num_predict %d is capped to %d draft tokens", k, MAX_NUM_SPECULATIVE_TOKENS)
            k = MAX_NUM_SPECULATIVE_TOKENS
        given = {"proposer": proposer or self.proposer, "draft_p_min": self.draft_p_min, "ngram_size": self.ngram_size}
        return SpeculationSettings(k, **_set(given))


def _set(values: dict) -> dict:
    """The values given: the settings' own defaults stand for the rest."""
    return {name: value for name, value in values.items() if value is not None}
