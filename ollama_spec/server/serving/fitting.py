"""A prompt longer than the context it is served with, made to fit, and said so.

A conversation keeps whole messages: its system messages and its latest turn always, the tools
offered when they fit beside those, then as many of the latest earlier turns as fit; the oldest turns
go first, whole, in stretches (DROP_SHARE), as chat front-ends expect. Ollama's chatPrompt drops old
messages too, but keeps the tools even when they alone overflow the context, so that its runner then
cuts the prompt's tokens and the model sees neither its tools nor its system prompt. What still does
not fit is cut as Ollama's runner cuts a prompt, except that a conversation keeps what comes before
its last message's text (the system prompt) and loses the start of that text; a prompt that is not a
conversation (raw text, a template's tokens, an earlier `context`) is cut as Ollama's runner cuts it.
Either way the request carries a warning that says what was left out and what num_ctx would keep it:
the `speculation` field of the response shows it, and the server logs it once for the request as it
runs (serving/state.py, after any reload for a larger context).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Sequence
from dataclasses import replace

from ollama_spec.engine.engine import Engine, Request
from ollama_spec.errors import InvalidRequest, InvalidSetting
from ollama_spec.prompting.messages import ChatMessage

OLLAMA_NUM_KEEP = 4  # Ollama's default num_keep: the prompt's first tokens a cut keeps
# A chat fitted to the context leaves its answer the room asked for (num_predict, max_tokens), else a
# quarter of the context up to ANSWER_TOKENS; at most half of it. Ollama's runner shifts the context to
# go on writing an answer that reaches its end; here an answer ends there. The room is the least an
# answer gets (it may go on into whatever else is free), so it does not grow with the context: a larger
# context holds a longer prompt, and tools that fit beside a chat are not left out to keep more room
ANSWER_SHARE = 4
ANSWER_TOKENS = 512  # about 380 words: a chat answer
# History is dropped in stretches of a quarter of the context or more, so that the next turns find the
# whole prompt but their own messages in the prompt cache (dropping just enough would move the prompt's
# start on every turn, and every turn would read it all again after the system message)
DROP_SHARE = 4


def answer_room(max_tokens: int | None, context: int) -> int:
    """The room a fitted chat leaves its answer in `context`: `max_tokens` (asked, or the server's), else
    ANSWER_SHARE's part of the context up to ANSWER_TOKENS; at most half of it."""
    return max(1, min(max_tokens or min(context // ANSWER_SHARE, ANSWER_TOKENS), context // 2))


def context_for(prompt: int, max_tokens: int | None) -> int:
    """The smallest context that holds `prompt` tokens with answer_room's room beside them, and so the
    one in which needs_fitting keeps them whole (as does every larger one: the room grows more slowly
    than the context): what a warning says would keep all of it, and the least a reload asks for."""
    context = prompt + 1
    while (needed := prompt + answer_room(max_tokens, context)) > context:  # the room grows with the context
        context = needed
    return context


def reload_size(loaded: int, wanted: int, trained: int) -> int:
    """The context to load a model again with for a prompt that needs `wanted` (context_for) when it has
    `loaded`: the loaded one doubled until it holds that, so that a chat growing a turn at a time reloads
    a few times, not on every turn; at most the `trained` length (0: unknown)."""
    size = max(loaded, 1)
    while size < wanted:
        size *= 2
    return min(size, trained) if trained else size


def needs_fitting(request: Request, context: int, max_tokens: int | None) -> bool:
    """Does the prompt (its tokens) need fitting: longer than the context, or a chat that leaves its
    answer less than answer_room (a prompt that is not a chat is cut only when it must be)."""
    n = len(request.tokens)
    return n >= context or bool(request.messages) and n + answer_room(max_tokens, context) > context


def fit_to_context(engine: Engine, request: Request, context: int, max_tokens: int | None = None) -> Request:
    """`request` made to fit `context` with answer_room's room for its answer (a chat: whole messages;
    what is still too long, or not a chat: cut to the context's first half), with a warning that says
    how, and the context that would hold it whole (`context_wanted`). A chat that fits but leaves its
    answer less room, and has nothing it can leave out, stays as it is, without a warning."""
    full, said, tools, chat = len(request.tokens), [], bool(request.tools), bool(request.messages)
    answer, wanted = answer_room(max_tokens, context), context_for(full, max_tokens)
    fitted = request
    if request.messages:
        fitted, left_out = _whole_messages(engine, request, context - answer + 1)
        said += [left_out] if left_out else []
    if len(fitted.tokens) >= context:
        keep = _before_last_message(engine, fitted) if fitted.messages else 0
        fitted, cut = _cut_as_ollama(engine, fitted, context, keep if keep <= context // 2 else 0)
        said.append(cut)
    if not said:  # it fits: the answer has what is left
        return replace(request, context_wanted=wanted)
    fix = f"a num_ctx of {wanted} or more would keep all of it"
    trained = engine.target_model.info.context_length
    if trained and wanted > trained:  # no num_ctx can help: say what would
        shorter = ("offer fewer tools or " if tools else "") + ("start a new chat" if chat else "shorten it")
        fix = f"not even the model's trained context ({trained} tokens) holds all of it: {shorter}"
    if full >= context:
        why = f"is longer than the context ({context} tokens)"
    else:
        why = f"leaves the answer fewer than {answer} of the context's {context} tokens"
    warning = f"the prompt ({full} tokens) {why}: {'; '.join(said)}; {fix}"
    return replace(fitted, warnings=(*fitted.warnings, warning), context_wanted=wanted)


def tools_tokens(engine: Engine, request: Request) -> int:
    """How many of the request's prompt tokens its tools' definitions take (0 without tools)."""
    if not request.tools:
        return 0
    try:
        return len(request.tokens) - len(engine.prompt_tokens(replace(request, tools=(), tokens=())))
    except InvalidSetting:
        return 0


def _whole_messages(engine: Engine, request: Request, context: int) -> tuple[Request, str]:
    """The conversation without the tools and oldest turns that do not fit, and what was left out.
    When not even its system messages and last message fit, those (the caller cuts them)."""
    messages = request.messages
    rendered: dict[tuple[int, bool], Request | None] = {}

    def from_(start: int, tools: bool) -> Request | None:  # None: the template refuses this start
        if (start, tools) not in rendered:
            kept = [m for m in messages[:start] if m.role == "system"] + list(messages[start:])
            candidate = replace(request, messages=tuple(kept), tools=request.tools if tools else (), tokens=())
            try:
                rendered[start, tools] = replace(candidate, tokens=tuple(engine.prompt_tokens(candidate)))
            except InvalidSetting:
                rendered[start, tools] = None
        return rendered[start, tools]

    users = [i for i, m in enumerate(messages) if m.role == "user"]
    latest = users[-1] if users else len(messages) - 1
    turns = sorted({0, *users}) if users else list(range(len(messages)))  # where a whole turn begins
    turns = _anchors(engine, messages, turns, max(1, context // DROP_SHARE))
    stages = [(turns, True)] if request.tools else []  # the tools before the oldest turns,
    stages += [(turns, False), (range(latest + 1, len(messages)), False)]  # the latest turn's start last
    for starts, tools in stages:
        start = _first_fitting(starts, lambda s, tools=tools: from_(s, tools), context)
        if start is not None:
            return from_(start, tools), _left_out(engine, request, from_(start, tools))
    shortest = from_(len(messages) - 1, False) or request  # Ollama's least: the system and last messages
    return shortest, _left_out(engine, request, shortest)


def _anchors(engine: Engine, messages: Sequence[ChatMessage], starts: list[int], step: int) -> list[int]:
    """The `starts` where the history before them first reaches each multiple of `step` tokens, and
    the last. They depend on the history alone, which a chat only adds to: from them the start stays
    where it was while the chat grows, and then moves on by a step or more."""
    tokenize = engine.target.tokenize
    sizes = [
        len(tokenize(m.content + "".join(json.dumps(c.arguments) for c in m.tool_calls), add_bos=False, special=False))
        for m in messages
    ]
    before = list(itertools.accumulate(sizes, initial=0))
    anchors: list[int] = []
    for start in starts:
        if not anchors or before[start] // step > before[anchors[-1]] // step:
            anchors.append(start)
    return anchors if anchors[-1] == starts[-1] else [*anchors, starts[-1]]


def _first_fitting(starts: Sequence[int], render: Callable[[int], Request | None], context: int) -> int | None:
    """The earliest of `starts` whose prompt fits (keeps the most), None when not even the last does.
    The prompt shrinks as the start moves on, so a bisection finds it with a handful of renderings
    (a start the template refuses counts as too long)."""

    def fits(i: int) -> bool:
        candidate = render(starts[i])
        return candidate is not None and len(candidate.tokens) < context

    if not starts or not fits(len(starts) - 1):
        return None
    too_long, fitting = -1, len(starts) - 1
    while fitting - too_long > 1:
        middle = (too_long + fitting) // 2
        too_long, fitting = (too_long, middle) if fits(middle) else (middle, fitting)
    return starts[fitting]


def _left_out(engine: Engine, request: Request, kept: Request) -> str:
    """What `kept` leaves out of `request`, in words ("" when nothing)."""
    parts = []
    if request.tools and not kept.tools:
        parts.append(f"the {len(request.tools)} tools offered ({tools_tokens(engine, request)} tokens)")
    dropped = len(request.messages) - len(kept.messages)
    if dropped:
        parts.append(f"the oldest {dropped} of {len(request.messages)} messages")
    if not parts:
        return ""
    return f"left out {' and '.join(parts)}, {len(request.tokens) - len(kept.tokens)} tokens in all"


def _before_last_message(engine: Engine, request: Request) -> int:
    """How many of the prompt's first tokens come before its last message's text (the system prompt
    and the template's opening of that message): those of the prompt without that text."""
    last = request.messages[-1]
    try:
        without = engine.prompt_tokens(
            replace(request, messages=(*request.messages[:-1], replace(last, content="")), tokens=())
        )
    except InvalidSetting:
        return 0
    return next((i for i, (a, b) in enumerate(zip(without, request.tokens)) if a != b), len(without))


def _cut_as_ollama(engine: Engine, request: Request, context: int, keep: int = 0) -> tuple[Request, str]:
    """A prompt still longer than the context, cut as Ollama's runner cuts it: its first `keep` tokens
    (a chat's, up to its last message's text; else Ollama's OLLAMA_NUM_KEEP and BOS) kept, then its
    end, to about half the context, so that the answer has the other half; and the cut in words."""
    tokens = request.tokens
    keep = max(0, min(keep or OLLAMA_NUM_KEEP + int(engine.target.add_bos), context - 1))
    limit = context - max((context - keep) // 2, 1)
    if limit < 1:  # Ollama's "no prompt budget": a context of one token holds no prompt and no answer
        raise InvalidRequest(f"a context of {context} token leaves no room for a prompt; raise num_ctx", "num_ctx")
    cut = replace(request, tokens=tokens[:keep] + tokens[len(tokens) - (limit - keep) :])
    return cut, f"cut {len(tokens)} tokens to {limit}, its first {keep} and its last {limit - keep}"
