"""Thinking models (Qwen3, DeepSeek-R1, ...): their reasoning, written between <think> and </think>,
kept apart from the answer, as Ollama returns it (`thinking` beside `content`).

A model thinks when its chat template knows both tags. As in Ollama 0.12, such a model's thinking
is separated unless the request says `think: false`, which also tells the template so (Qwen3's
`enable_thinking`). A template may open the block itself at the end of the prompt (DeepSeek-R1's
newer ones do); then the answer starts inside it.
"""

from __future__ import annotations

OPEN, CLOSE = "<think>", "</think>"


def template_thinks(template: str | None) -> bool:
    return bool(template) and OPEN in template and CLOSE in template


def opened_by_prompt(prompt_text: str) -> bool:
    """Does the rendered prompt end inside a thinking block (the template opened it)?"""
    return prompt_text.rstrip().endswith(OPEN)


class ThinkingSplit:
    """Streamed text in, (thinking, content) pieces out; text that may be the start of a tag is held."""

    def __init__(self, thinking: bool = False):
        # "start": nothing seen yet (an opening tag may come); "thinking"; "content"
        self.state = "thinking" if thinking else "start"
        self.held = ""
        self.skip_space = thinking  # the whitespace after a tag belongs to neither part

    def push(self, text: str) -> tuple[str, str]:
        self.held += text
        thinking = content = ""
        while self.held:
            if self.skip_space and self.state != "start":
                self.held = self.held.lstrip()
                if not self.held:
                    break
                self.skip_space = False
            if self.state == "start":
                start = self.held.lstrip()
                if start.startswith(OPEN):
                    self.held, self.state, self.skip_space = start[len(OPEN) :], "thinking", True
                elif OPEN.startswith(start):
                    break  # whitespace, or part of the tag: wait for more
                else:
                    self.state = "content"
            elif self.state == "thinking":
                end = self.held.find(CLOSE)
                if end < 0:
                    keep = partial_suffix(self.held, CLOSE)
                    thinking += self.held[: len(self.held) - keep]
                    self.held = self.held[len(self.held) - keep :]
                    break
                thinking += self.held[:end]
                self.held, self.state, self.skip_space = self.held[end + len(CLOSE) :], "content", True
            else:
                content, self.held = content + self.held, ""
        return thinking, content

    def finish(self) -> tuple[str, str]:
        """What is still held: unfinished thinking stays thinking; anything else is the answer."""
        held, self.held = self.held, ""
        if self.skip_space:
            held = held.lstrip()
        return (held, "") if self.state == "thinking" else ("", held)


def partial_suffix(text: str, tag: str) -> int:
    """The length of the longest end of `text` that is a beginning of `tag` (a tag still arriving)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0
