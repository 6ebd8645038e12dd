"""Tokens with their log-probabilities, as the APIs list them: the shape both give (token text,
logprob, bytes, alternatives), and the older shape of OpenAI's completions."""

from __future__ import annotations

import codecs
from collections.abc import Sequence

from ollama_spec.decoding.loop import Token
from ollama_spec.llama.model import LoadedModel


def scored(target: LoadedModel, tokens: Sequence[Token]) -> list[dict]:
    """Tokens with their log-probabilities, as both APIs list them: token text, logprob, bytes, top."""
    return [
        _scored(target, t.id, t.logprob) | {"top_logprobs": [_scored(target, i, lp) for i, lp in t.top]} for t in tokens
    ]


def _scored(target: LoadedModel, token: int, logprob: float) -> dict:
    piece, _ = target.token_piece(token)
    return {"token": piece.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(piece)}


class LegacyLogprobs:
    """The completions API's older shape: parallel lists, each token's alternatives as a dict, and
    where each token starts in the choice's text (in characters; a control token's text is not
    part of it). Called chunk by chunk when streaming, it goes on counting from where the last
    chunk ended.

    A token that is part of a character (a byte-fallback token, a split emoji) is named as OpenAI
    names it, "bytes:\\xe4\\xb8", so that alternatives do not collide as one U+FFFD, and takes
    no room in the text until its character is whole.
    """

    def __init__(self):
        self.at = 0
        self.text = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def __call__(self, scored: list[dict], in_text: list[bool]) -> dict:
        offsets = []
        for entry, shown in zip(scored, in_text):
            offsets.append(self.at)
            self.at += len(self.text.decode(bytes(entry["bytes"]))) if shown else 0
        return {
            "tokens": [_legacy_token(e) for e in scored],
            "token_logprobs": [e["logprob"] for e in scored],
            "top_logprobs": [{_legacy_token(t): t["logprob"] for t in e["top_logprobs"]} for e in scored],
            "text_offset": offsets,
        }


def _legacy_token(entry: dict) -> str:
    raw = bytes(entry["bytes"])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
