"""Request building: what a client asked (`Asked`), checked against the loaded model and turned into an
engine Request whose prompt and max_tokens fit the context (fitting.py: what does not fit, and the warning)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from ollama_spec.decoding.parameters import as_layer, sampling_settings
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.errors import InvalidRequest, InvalidSetting, PromptTooLong
from ollama_spec.llama.grammar import Grammar, grammar_for_json
from ollama_spec.prompting.messages import ChatMessage
from ollama_spec.prompting.thinking import template_thinks
from ollama_spec.prompting.tools import forced_call_schema, tool_names
from ollama_spec.server.serving.fitting import context_for, fit_to_context, needs_fitting, tools_tokens
from ollama_spec.server.serving.settings import ServerSettings

# compiled grammars by (the target model's file, the grammar's text): see build_request
Grammars = dict[tuple[str, str], Grammar]


@dataclass(frozen=True)
class Asked:
    """What one HTTP request asks, in the engine's terms, before it is checked against the model.
    Sampling fields left None take the server's defaults."""

    prompt: str = ""
    messages: Sequence[ChatMessage] = ()
    system: str | None = None
    raw: bool = False
    max_tokens: int | None = None
    max_tokens_name: str = "max_tokens"  # the field's name in the route's API, for its errors
    stop: Sequence[str] = ()
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    ignore_eos: bool = False
    n_ctx: int | None = None
    grammar: str | None = None
    context: Sequence[int] = ()  # Ollama's /api/generate `context`: an earlier exchange's tokens
    tools: Sequence[dict] = ()
    logprobs: int | None = None
    think: bool | None = None
    suffix: str | None = None
    tokens: Sequence[int] = ()  # the prompt already as tokens (a template the request brought)
    # a max_tokens past the room left is a cap, as Ollama's num_predict is (else a 400, as OpenAI answers)
    cap_max_tokens: bool = False
    default_max_tokens: int | None = None  # the route's own default, below the server's
    # a conversation longer than the context loses its tools and oldest turns, whole, and a prompt still
    # too long is cut as Ollama's runner cuts it (fitting.py); else such a prompt is a 400
    truncate: bool = False
    penalties: dict[str, Any] | None = None  # Penalties fields (logit_bias as (token id, bias) pairs)
    show_draft: bool = False  # say which characters of the content the draft wrote (draft_spans.py)


def check_asked(asked: Asked) -> None:
    """What can be checked of `asked` before its model loads: the tools' names and a max_tokens of at least 1.
    Every route checks it so (ServerState.prepare_each); build_request checks the rest, against the model."""
    if asked.tools:
        try:
            tool_names(list(asked.tools))
        except InvalidSetting as exc:
            raise InvalidRequest(str(exc), "tools") from None
    if asked.max_tokens is not None and asked.max_tokens < 1:
        name = asked.max_tokens_name
        raise InvalidRequest(f"{name} must be at least 1, got {asked.max_tokens}", name)


def build_request(engine: Engine, settings: ServerSettings, asked: Asked, grammars: Grammars | None = None) -> Request:
    """A checked engine Request: the prompt fits the context, so does max_tokens, and llama.cpp can
    parse the output grammar. `grammars`: the grammars compiled for the same model before (the other prompts of
    one request, its pair before a reload), which this one takes rather than compile its own again."""
    request = _unchecked(engine, settings, asked)
    if asked.think and not template_thinks(engine.target_model.info.chat_template):
        raise InvalidRequest(f'"{engine.target_model.name}" does not support thinking', "think")  # Ollama: %q
    if asked.tools and not engine.target_model.info.chat_template:
        raise InvalidRequest(f"{engine.target_model.name} does not support tools: it has no chat template", "tools")
    if asked.context:
        request = replace(request, tokens=tuple(_after_context(engine, asked.context, request)))
    if asked.grammar is not None:  # compiled once, here: an InvalidSetting is the grammar llama.cpp cannot parse
        request = replace(request, compiled_grammar=_compiled(engine, asked.grammar, grammars))
    context = min(asked.n_ctx or engine.target.n_ctx, engine.target.n_ctx)
    # tokenized once: the generation, and the routes that read the prompt, take these
    request = replace(request, tokens=tuple(engine.prompt_tokens(request)))
    max_tokens = asked.max_tokens or settings.max_tokens
    if asked.truncate and needs_fitting(request, context, max_tokens):
        request = fit_to_context(engine, request, context, max_tokens)
    n_prompt = len(request.tokens)
    tools = (
        f" ({tools_tokens(engine, request)} of them the {len(request.tools)} tools offered)"
        if n_prompt >= context and request.tools
        else ""
    )
    trained = engine.target_model.info.context_length or 0
    return replace(request, max_tokens=_max_tokens(settings, asked, n_prompt, context, tools, trained))


def _compiled(engine: Engine, gbnf: str, grammars: Grammars | None) -> Grammar:
    """`gbnf` over the target's vocabulary, compiled once per model in `grammars` (each generation starts
    a copy of it, and none advances it)."""
    key = (str(engine.target_model.path), gbnf)
    if grammars is None or key not in grammars:
        compiled = engine.grammar(gbnf)
        if grammars is None:
            return compiled
        grammars[key] = compiled
    return grammars[key]


def _unchecked(engine: Engine, settings: ServerSettings, asked: Asked) -> Request:
    """The Request as asked, over the server's defaults (and a Modelfile's MESSAGE lines first)."""
    given = {
        "temperature": asked.temperature,
        "top_p": asked.top_p,
        "top_k": asked.top_k,
        "min_p": asked.min_p,
        "seed": asked.seed,
    }
    if asked.penalties:
        _check_token_ids(engine, dict(asked.penalties.get("logit_bias", ())), "logit_bias")
    # the request's options over the model's settings (the flags over its params), by the one rule
    sampling = sampling_settings(given | dict(asked.penalties or {}), as_layer(settings.sampling))
    messages = asked.messages
    history = engine.target_model.messages  # a Modelfile's MESSAGE lines: Ollama puts them first
    if history and not asked.raw and not asked.tokens and not asked.context and asked.suffix is None:
        messages = [*history, *(messages or [ChatMessage("user", asked.prompt)])]
    return Request(
        prompt=asked.prompt,
        messages=tuple(messages),
        system=asked.system,
        raw=asked.raw,
        stop=tuple(asked.stop) + settings.stop,
        ignore_eos=asked.ignore_eos,
        sampling=sampling,
        speculation=settings.speculation,
        grammar=asked.grammar,
        tools=tuple(asked.tools),
        logprobs=asked.logprobs,
        think=asked.think,
        suffix=asked.suffix,
        tokens=tuple(asked.tokens),
        show_draft=asked.show_draft,
    )


def _max_tokens(
    settings: ServerSettings, asked: Asked, n_prompt: int, context: int, tools: str = "", trained: int = 0
) -> int:
    """The generation's limit: what was asked, if the room left after the prompt holds it (or as a cap).
    `tools`: what the tools take of the prompt, in words, for the error that says it is too long;
    `trained`: the model's trained context (0: unknown), past which no num_ctx helps."""
    room, max_tokens, name = context - n_prompt, asked.max_tokens, asked.max_tokens_name
    if room < 1:
        fewer = " or offer fewer tools" if tools else ""
        if trained and n_prompt >= trained:
            fix = f"shorten it{fewer}: it is past the model's trained context ({trained} tokens), which no num_ctx changes"
        else:
            fix = f"shorten it{fewer.replace(' or', ',')} or load the model with a larger num_ctx"
        wanted = context_for(n_prompt, max_tokens or settings.max_tokens)
        raise PromptTooLong(f"the prompt is {n_prompt} tokens{tools} but the context holds {context}; {fix}", wanted)
    if max_tokens is not None and max_tokens > room:
        if not asked.cap_max_tokens:
            raise PromptTooLong(
                f"{name} {max_tokens} is beyond the context: the prompt takes {n_prompt} of its "
                f"{context} tokens, which leaves {room}",
                n_prompt + max_tokens,
                name,
            )
        max_tokens = room  # the generation ends there, with finish reason "length"
    return max_tokens or min(settings.max_tokens or asked.default_max_tokens or room, room)


def _check_token_ids(engine: Engine, ids: dict[int, float], param: str) -> None:
    n_vocab = engine.target.n_vocab
    wrong = next((token for token in ids if not 0 <= token < n_vocab), None)
    if wrong is not None:
        raise InvalidRequest(f"{param}: token id {wrong} is not in the model's vocabulary (0..{n_vocab - 1})", param)


def _after_context(engine: Engine, context: Sequence[int], request: Request) -> list[int]:
    """An earlier exchange's tokens, then this prompt's."""
    target = engine.target
    if any(not 0 <= token < target.n_vocab for token in context):
        raise InvalidRequest(
            f"context holds token ids outside this model's vocabulary (0..{target.n_vocab - 1})", "context"
        )
    prompt = engine.prompt_tokens(request)
    if prompt and target.add_bos and prompt[0] == target.bos_token:
        prompt = prompt[1:]  # one BOS, at the start of the context
    return [*context, *prompt]


def think_if_able(engine: Engine, think: bool | None) -> bool | None:
    """`think` for a thinking model, else None (OpenAI clients send reasoning_effort to any model)."""
    return think if template_thinks(engine.target_model.info.chat_template) else None


def offer_tools(
    tools: list[dict], choice: str | dict | None, only: str | None, constrained: bool
) -> tuple[list[dict], str | None]:
    """The tools to show the model (chat completions' shape) and, for tool_choice "required" or a named
    function (`only`), the grammar that forces one call; `constrained`: the request has its own format."""
    if not tools or choice == "none":
        return [], None
    if choice in (None, "auto"):
        return tools, None
    if constrained:
        raise InvalidRequest("a forced tool call and an output format or grammar cannot be combined", "tool_choice")
    try:
        return tools, grammar_for_json(forced_call_schema(tools, only))
    except InvalidSetting as exc:
        raise InvalidRequest(str(exc), "tool_choice") from None


def json_grammar(schema: object = None, param: str = "format") -> str:
    """The grammar for a JSON object (schema None) or for JSON matching `schema`; 400 when it cannot be built."""
    try:
        return grammar_for_json(schema)
    except InvalidSetting as exc:
        raise InvalidRequest(str(exc), param) from None
