"""A request's prompt as target tokens: given as tokens, filled in the middle, raw text, or its
conversation through the model's chat template."""

from __future__ import annotations

from collections.abc import Sequence

from ollama_spec.engine.requests import Request
from ollama_spec.errors import InvalidSetting
from ollama_spec.llama.model import LoadedModel
from ollama_spec.models.resolve import ResolvedModel
from ollama_spec.prompting.chat import chat_text
from ollama_spec.prompting.messages import ChatMessage


class Prompts:
    """Prompt building for one loaded target (`model` is what it was loaded from: template, system)."""

    def __init__(self, target: LoadedModel, model: ResolvedModel):
        self.target, self.model = target, model

    def tokens(self, request: Request) -> list[int]:
        """The request as target tokens: chat-templated unless raw or the model has no template."""
        if request.tokens:
            return list(request.tokens)
        if request.suffix is not None:
            return self.infill_tokens(request.prompt, request.suffix)
        if request.raw and not request.messages:
            return self.target.tokenize(request.prompt, add_bos=self.target.add_bos, special=False)
        messages = request.conversation(self.model.system)
        text = None if request.raw else self.chat_text(messages, request.tools, request.think)
        if text is None:
            text = "\n\n".join(m.content for m in messages if m.content)
            return self.target.tokenize(text, add_bos=self.target.add_bos, special=False)
        return self.templated_tokens(text)

    def templated_tokens(self, text: str) -> list[int]:
        """Text a template wrote, as target tokens: its special tokens read as such, and one BOS."""
        info = self.model.info
        bos = info.token_text(info.bos_id) or ""
        add_bos = self.target.add_bos and not (bos and text.startswith(bos))
        return self.target.tokenize(text, add_bos=add_bos, special=True)

    def infill_tokens(self, prefix: str, suffix: str) -> list[int]:
        """Fill in the middle as llama.cpp's server lays it out: BOS, the prefix marker and the text
        before the gap, the suffix marker and the text after it, then the middle marker."""
        markers = self.target.fill_in_the_middle_tokens()
        if markers is None:
            raise InvalidSetting(
                f"{self.model.name} has no fill-in-the-middle tokens: it cannot complete "
                "between a prompt and a suffix (code models such as qwen2.5-coder can)"
            )
        pre, suf, mid = markers
        tokens = [self.target.bos_token] if self.target.add_bos else []
        tokenize = self.target.tokenize
        return [
            *tokens,
            pre,
            *tokenize(prefix, add_bos=False, special=False),
            suf,
            *tokenize(suffix, add_bos=False, special=False),
            mid,
        ]

    def chat_text(
        self, messages: list[ChatMessage], tools: Sequence[dict] = (), think: bool | None = None
    ) -> str | None:
        """`messages` (and the `tools` offered) through the model's chat template, ending with the
        assistant's cue; None without a template."""
        info = self.model.info
        return chat_text(
            info.chat_template,
            messages,
            tools,
            think,
            bos_token=info.token_text(info.bos_id) or "",
            eos_token=info.token_text(info.eos_id) or "",
        )
