"""A multi-turn conversation over one Engine, whose next prompt extends the cached tokens exactly.

The engine keeps whatever prefix of a prompt its KV caches already hold. Rendering the whole
conversation again each turn would usually re-tokenize the model's own answer differently from
the tokens it generated, and everything after the first difference would be evaluated again.
So the next prompt is built from tokens: the previous prompt, the answer exactly as generated,
then the template's text after the answer (its end-of-turn mark, the new user turn and the
assistant's cue) tokenized alone. Where the template does not render earlier turns the same way
(or the answer was cut by a stop string), the whole conversation is rendered instead.
"""

from __future__ import annotations

from dataclasses import replace

from ollama_spec.engine.engine import Engine
from ollama_spec.engine.generation import Generation
from ollama_spec.engine.requests import Request, Result
from ollama_spec.prompting.messages import ChatMessage

# Stands in for the answer while the template renders the next turn; no template alters it.
_ANSWER_MARK = "\x00ollama-spec answer\x00"


class Conversation:
    """The messages so far and the exact target tokens of the last prompt and answer."""

    def __init__(
        self, engine: Engine, defaults: Request, system: str | None = None, history: tuple[ChatMessage, ...] = ()
    ):
        self.engine, self.defaults, self.system, self.history = engine, defaults, system, history
        self.messages: list[ChatMessage] = list(history)
        self.last: Result | None = None
        self._prompt: list[int] = []  # the last prompt's tokens, and the text they were made from
        self._prompt_text: str | None = None
        self._answer: list[int] | None = None  # the last answer's tokens, when they spell its text exactly

    def reset(self) -> None:
        """Forget the turns (a preset's MESSAGE history stays); the system prompt stays."""
        self.messages = list(self.history)
        self._prompt, self._prompt_text, self._answer = [], None, None

    def set_system(self, text: str | None) -> None:
        self.system = text or None
        self._prompt, self._prompt_text, self._answer = [], None, None  # the prefix changed: render anew

    def ask(self, text: str) -> Generation:
        """Start the answer to the user's `text`; consume it, then call `finish` with it."""
        turn = self._conversation() + [ChatMessage("user", text)]
        tokens = self._extended(turn) or self.engine.prompt_tokens(replace(self.defaults, messages=tuple(turn)))
        self._pending = (turn, tokens)
        return self.engine.generate(replace(self.defaults, messages=tuple(turn), tokens=tuple(tokens)))

    def prompt_length(self, text: str) -> int:
        """How many tokens the prompt for the user's `text` would have (for a full-context check)."""
        turn = self._conversation() + [ChatMessage("user", text)]
        return len(self._extended(turn) or self.engine.prompt_tokens(replace(self.defaults, messages=tuple(turn))))

    def finish(self, generation: Generation) -> Result:
        """Record the (possibly interrupted) answer as the assistant's turn."""
        turn, tokens = self._pending
        result = generation.result
        self.messages = turn[len(self._system_messages()) :] + [ChatMessage("assistant", result.text)]
        self._prompt, self._prompt_text = tokens, self.engine.chat_text(turn, think=self.defaults.think)
        spelled = b"".join(self.engine.target.token_piece(t)[0] for t in result.tokens).decode("utf-8", "replace")
        self._answer = list(result.tokens) if spelled == result.text else None
        self.last = result
        return result

    def _system_messages(self) -> list[ChatMessage]:
        return [ChatMessage("system", self.system)] if self.system else []

    def _conversation(self) -> list[ChatMessage]:
        return self._system_messages() + self.messages

    def _extended(self, turn: list[ChatMessage]) -> list[int] | None:
        """The last prompt + answer tokens + the template's text after the answer, or None."""
        if self._answer is None or self._prompt_text is None:
            return None
        # turn: ..., the last user turn, the last answer, the new user turn. The mark takes the answer's place.
        text = self.engine.chat_text(
            turn[:-2] + [ChatMessage("assistant", _ANSWER_MARK), turn[-1]], think=self.defaults.think
        )
        before, found, after = (text or "").partition(_ANSWER_MARK)
        if not found or before != self._prompt_text:
            return None
        return self._prompt + self._answer + self.engine.target.tokenize(after, add_bos=False, special=True)
