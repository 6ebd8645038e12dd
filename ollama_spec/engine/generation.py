"""One request's generation: what is asked (Request), what comes back (Result), and the stream of
text that fills the result (Generation), over a loaded Engine."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ollama_spec.prompting.messages import ChatMessage
from ollama_spec.errors import InvalidSetting
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.decoding.loop import SpeculationSettings, SpeculationStats, Token, generate_tokens
from ollama_spec.prompting.text_stream import TextStream

if TYPE_CHECKING:
    from ollama_spec.engine.engine import Engine

DEFAULT_MAX_TOKENS = 512


@dataclass(frozen=True)
class Request:
    prompt: str = ""
    system: str | None = None  # None: the model's system layer
    raw: bool = False  # True: no chat template, the prompt is the text to continue
    messages: tuple[ChatMessage, ...] = ()  # a conversation, instead of one prompt
    tokens: tuple[int, ...] = ()  # the prompt already as target tokens (a chat's exact history): used as it is
    max_tokens: int = DEFAULT_MAX_TOKENS
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # benchmarks: always generate max_tokens
    sampling: SamplingSettings = SamplingSettings()
    speculation: SpeculationSettings = SpeculationSettings()
    grammar: str | None = None  # GBNF the output must match (structured output: see grammar.py)
    tools: tuple[dict, ...] = ()  # tools offered to the model (OpenAI's shape), rendered by its chat template
    logprobs: int | None = None  # report each token's log-probability and this many alternatives (None: off)
    think: bool | None = None  # a thinking model: think (True), answer at once (False), or its default (None)
    suffix: str | None = None  # fill in the middle: the text after the gap, `prompt` being the text before it

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InvalidSetting(f"--max-tokens must be at least 1, got {self.max_tokens}")

    def conversation(self, default_system: str | None) -> list[ChatMessage]:
        """The messages to render: the conversation (or the prompt), after a system message if any."""
        system = self.system if self.system is not None else default_system
        messages = list(self.messages) or [ChatMessage("user", self.prompt)]
        if system and not any(m.role == "system" for m in messages):
            messages.insert(0, ChatMessage("system", system))
        return messages


@dataclass
class Result:
    """Filled in while a Generation is consumed; complete once iteration ends."""

    prompt_tokens: int = 0
    tokens: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str = ""  # "stop" (end of turn or stop string), "length" or "context"
    prompt_seconds: float = 0.0
    first_token_seconds: float = 0.0
    total_seconds: float = 0.0
    speculation: SpeculationStats = field(default_factory=SpeculationStats)
    scored: list[Token] = field(default_factory=list)  # with Request.logprobs: each token, scored by the target

    @property
    def tokens_per_second(self) -> float:
        decode = self.total_seconds - self.first_token_seconds
        return (len(self.tokens) - 1) / decode if len(self.tokens) > 1 and decode > 0 else 0.0


class Generation:
    """Iterate for text pieces as they are accepted; `result` holds tokens, reason and stats."""

    def __init__(self, engine: Engine, request: Request, use_draft: bool = True):
        self.engine, self.request, self.use_draft = engine, request, use_draft
        self.result = Result()

    def __iter__(self) -> Iterator[str]:
        engine, request, result = self.engine, self.request, self.result
        start = time.perf_counter()
        prompt = engine.prompt_tokens(request)
        result.prompt_tokens = len(prompt)
        if not prompt:  # a raw empty prompt to a model that adds no BOS token: nothing to continue
            raise InvalidSetting("the prompt is empty: give some text for the model to continue")
        if len(prompt) >= engine.target.n_ctx:
            raise InvalidSetting(
                f"the prompt is {len(prompt)} tokens but the context holds {engine.target.n_ctx}; "
                "raise --ctx or shorten it"
            )
        stream = TextStream(request.stop)
        proposer = engine.proposer(request.speculation) if self.use_draft else None
        policy = engine.k_policy(request.speculation, request.sampling) if proposer is not None else None
        grammar = engine.grammar(request.grammar) if request.grammar else None
        tokens = generate_tokens(
            engine.target, proposer, prompt, request.sampling, request.speculation, result.speculation, policy, grammar,
            request.logprobs,
        )
        result.finish_reason = "context"
        try:
            for token in tokens:
                if not result.tokens:
                    result.first_token_seconds = time.perf_counter() - start
                if not request.ignore_eos and engine.is_end_of_turn(token.id):
                    result.finish_reason = "stop"
                    break
                result.tokens.append(token.id)
                if request.logprobs is not None:
                    result.scored.append(token)
                piece, special = engine.target.token_piece(token.id)
                text = stream.push(piece, special=special)
                if text:
                    result.text += text
                    yield text
                if stream.stopped:
                    result.finish_reason = "stop"
                    break
                if len(result.tokens) >= request.max_tokens:
                    result.finish_reason = "length"
                    break
            text = stream.finish()
            if text:
                result.text += text
                yield text
        finally:
            tokens.close()
            if grammar is not None:
                grammar.close()
            engine.keep_learned_costs(request.speculation, policy)
            result.total_seconds = time.perf_counter() - start
