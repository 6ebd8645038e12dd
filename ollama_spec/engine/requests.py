"""What a generation is asked (Request) and what comes back (Result): plain data, no model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ollama_spec.decoding.loop import SpeculationSettings, SpeculationStats, Token
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.errors import InvalidSetting
from ollama_spec.prompting.messages import ChatMessage

if TYPE_CHECKING:
    from ollama_spec.llama.grammar import Grammar

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
    trace_batches: bool = False  # benchmarks: record the target's batches (SpeculationStats.batches)
    sampling: SamplingSettings = SamplingSettings()
    speculation: SpeculationSettings = SpeculationSettings()
    grammar: str | None = None  # GBNF the output must match (structured output: see grammar.py)
    # `grammar` compiled when the request was checked (the server's): each generation starts a copy of it
    compiled_grammar: Grammar | None = field(default=None, compare=False, repr=False)
    tools: tuple[dict, ...] = ()  # tools offered to the model (OpenAI's shape), rendered by its chat template
    logprobs: int | None = None  # report each token's log-probability and this many alternatives (None: off)
    think: bool | None = None  # a thinking model: think (True), answer at once (False), or its default (None)
    suffix: str | None = None  # fill in the middle: the text after the gap, `prompt` being the text before it
    # the server's show_draft: its worker iterates Generation.pieces, so that each piece says which of
    # its text the draft wrote (the tokens are the same either way)
    show_draft: bool = False
    warnings: tuple[str, ...] = ()  # what the client should know of how the prompt was read (a cut one)
    context_wanted: int = 0  # a prompt fitted into the context: the context that would hold it whole

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
    # iterated by Generation.pieces: per character of text, whether an accepted draft token wrote it
    drafted: list[bool] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # the Request's, for the response to show

    @property
    def tokens_per_second(self) -> float:
        decode = self.total_seconds - self.first_token_seconds
        return (len(self.tokens) - 1) / decode if len(self.tokens) > 1 and decode > 0 else 0.0
