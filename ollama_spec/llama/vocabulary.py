"""A loaded model's text side: text to tokens and back, its special tokens."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp
from llama_cpp._internals import LlamaModel

from ollama_spec.llama.tokenizing import Tokenizer


class Vocabulary:
    """Text <-> tokens over one loaded model's vocabulary (a LoadedModel hands out its methods)."""

    def __init__(self, model: LlamaModel):
        self._model = model
        self.vocab = model.vocab
        self.add_bos = model.add_bos_token()
        self.bos_token = model.token_bos()
        self.eos_token = model.token_eos()
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._tokenizer = Tokenizer(model)

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        return self._tokenizer.tokenize(text, add_bos=add_bos, special=special)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The token's text as raw bytes (a piece may hold part of a UTF-8 character).

        Control tokens (`<|eot_id|>`, `<|im_start|>`) render as nothing unless `special`.
        """
        piece = self._pieces.get((token, special))
        if piece is None:
            size = 64
            while True:
                buf = ctypes.create_string_buffer(size)
                n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, size, 0, special)
                if n >= 0:
                    break
                size = -n
            piece = self._pieces[(token, special)] = buf.raw[:n]
        return piece

    def token_piece(self, token: int) -> tuple[bytes, bool]:
        """The token's bytes and whether they are a special token's text (`<|eot_id|>`)."""
        piece = self.token_bytes(token)
        if piece:
            return piece, False
        special = self.token_bytes(token, special=True)
        return special, bool(special)

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return self._model.detokenize(list(tokens), special=special).decode("utf-8", errors="replace")

    def fill_in_the_middle_tokens(self) -> tuple[int, int, int] | None:
        """The vocabulary's prefix, suffix and middle markers (code models: Qwen2.5-Coder, CodeLlama,
        StarCoder2), or None when it has none."""
        ids = (
            llama_cpp.llama_vocab_fim_pre(self.vocab),
            llama_cpp.llama_vocab_fim_suf(self.vocab),
            llama_cpp.llama_vocab_fim_mid(self.vocab),
        )
        return None if min(ids) < 0 else ids

    def is_end_of_generation(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
