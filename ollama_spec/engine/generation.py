"""One request's generation: the stream of text pieces that fills its Result, over a loaded target,
the proposer that drafts for it and the step costs its K policy learns from."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from ollama_spec.decoding.loop import generate_tokens
from ollama_spec.decoding.proposers import Proposer
from ollama_spec.engine.costs import LearnedCosts
from ollama_spec.engine.requests import Request, Result
from ollama_spec.errors import InvalidSetting
from ollama_spec.llama.grammar import Grammar
from ollama_spec.llama.model import LoadedModel
from ollama_spec.prompting.text_stream import TextStream


class Generation:
    """Iterate for text pieces as they are accepted; `result` holds tokens, reason and stats.

    `prompt` builds the prompt's tokens when iteration starts; without a `proposer` the target
    runs alone. `end_of_turn` says which tokens end the answer."""

    def __init__(
        self,
        target: LoadedModel,
        request: Request,
        prompt: Callable[[], list[int]],
        *,
        end_of_turn: Callable[[int], bool],
        proposer: Proposer | None,
        costs: LearnedCosts,
    ):
        self.target, self.request, self.prompt = target, request, prompt
        self.end_of_turn, self.proposer, self.costs = end_of_turn, proposer, costs
        self.result = Result()

    def __iter__(self) -> Iterator[str]:
        target, request, result, proposer = self.target, self.request, self.result, self.proposer
        start = time.perf_counter()
        prompt = self.prompt()
        result.prompt_tokens = len(prompt)
        if not prompt:  # a raw empty prompt to a model that adds no BOS token: nothing to continue
            raise InvalidSetting("the prompt is empty: give some text for the model to continue")
        if len(prompt) >= target.n_ctx:
            raise InvalidSetting(
                f"the prompt is {len(prompt)} tokens but the context holds {target.n_ctx}; raise --ctx or shorten it"
            )
        stream = TextStream(request.stop)
        policy = self.costs.k_policy(request.speculation, request.sampling) if proposer is not None else None
        grammar = Grammar.for_model(target, request.grammar) if request.grammar else None
        tokens = generate_tokens(
            target,
            proposer,
            prompt,
            request.sampling,
            request.speculation,
            result.speculation,
            policy,
            grammar,
            request.logprobs,
        )
        result.finish_reason = "context"
        try:
            for token in tokens:
                if not result.tokens:
                    result.first_token_seconds = time.perf_counter() - start
                if not request.ignore_eos and self.end_of_turn(token.id):
                    result.finish_reason = "stop"
                    break
                result.tokens.append(token.id)
                if request.logprobs is not None:
                    result.scored.append(token)
                piece, special = target.token_piece(token.id)
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
            self.costs.keep_learned(request.speculation, policy)
            result.total_seconds = time.perf_counter() - start
