"""What `serve`'s sampling and speculation flags set for every request, as data: the flags given, by Ollama's
parameter names. Laid over a model's own params (its params layer, a preset's PARAMETER lines over them) by
decoding/parameters.resolve, the rule every face resolves by: the flags, else the params, else the defaults;
a request's own options beat them all (request.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ollama_spec.decoding.parameters import resolve
from ollama_spec.decoding.proposer_table import DRAFT
from ollama_spec.server.serving.settings import ServerSettings

log = logging.getLogger("ollama_spec.server")


@dataclass(frozen=True)
class RequestDefaults:
    """serve's flags: `flags` the ones given, by Ollama's names (num_speculative_tokens None: -k auto), and
    the source the pairs draft with unless theirs says otherwise (`proposer`: --ngram's hybrid)."""

    flags: Mapping[str, Any] = field(default_factory=dict)
    proposer: str = DRAFT

    def over(self, params: Mapping, base: ServerSettings, proposer: str | None = None) -> ServerSettings:
        """`base` with the requests' defaults for a model whose params are `params`, its pair drafting with
        `proposer` (--pair's n-gram lookup; None: as the flags say); the stop strings and num_predict are
        the model's."""
        chosen = resolve(params, self.flags, proposer=proposer or self.proposer, notice=log.info)
        return replace(
            base,
            sampling=chosen.sampling,
            speculation=chosen.speculation,
            stop=chosen.stop,
            max_tokens=chosen.max_tokens,
        )
