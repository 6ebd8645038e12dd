"""One request's generation: the stream of text pieces that fills its Result, over a loaded target,
the proposer that drafts for it and the step costs its K policy learns from; the same text as runs
that say which of it the draft proposed (`Generation.pieces`, `token_runs`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence

from ollama_spec.decoding.evals import Eval, evaluated
from ollama_spec.decoding.loop import PromptChunk, Token, generate_steps
from ollama_spec.decoding.proposers import Proposer
from ollama_spec.engine.costs import LearnedCosts
from ollama_spec.engine.requests import Request, Result
from ollama_spec.errors import InvalidSetting
from ollama_spec.llama.grammar import Grammar
from ollama_spec.llama.model import LoadedModel
from ollama_spec.prompting.text_stream import Run, TextStream, merge_runs


class Generation:
    """Iterate for text pieces as they are accepted; `result` holds tokens, reason and stats.

    `prompt` builds the prompt's tokens when iteration starts; without a `proposer` the target
    runs alone. `end_of_turn` says which tokens end the answer; `stop`, whether its request was cancelled
    (then a step waiting for its output grammar raises Stopped)."""

    def __init__(
        self,
        target: LoadedModel,
        request: Request,
        prompt: Callable[[], list[int]],
        *,
        end_of_turn: Callable[[int], bool],
        proposer: Proposer | None,
        costs: LearnedCosts,
        stop: Callable[[], bool] | None = None,
    ):
        self.target, self.request, self.prompt = target, request, prompt
        self.end_of_turn, self.proposer, self.costs = end_of_turn, proposer, costs
        self.stop = stop  # whether the request was cancelled: a long grammar check stops waiting then
        self.result = Result(warnings=list(request.warnings))
        self.prompt_chunk: PromptChunk | None = None  # the most prompt tokens an evaluation reads (step_loop.py)
        self.shared = False  # some of its steps ran beside other requests' (step_loop.py)
        self.policy = None  # its K policy, once it runs (the step loop sets a shared step's K on it)
        self.driver: Callable[[Generation, bool], Iterator] | None = None  # what runs its steps when iterated
        self._grammar: Grammar | None = None  # its output grammar, once it runs
        self._token_piece = target.token_piece  # looked up once: a SequenceView finds it through __getattr__
        if request.trace_batches:
            self.result.speculation.batches = []

    def __iter__(self) -> Iterator[str]:
        return self._driven(runs=False)

    def pieces(self) -> Iterator[Run]:
        """Iterate instead of `iter()` for the same text as runs, each all from accepted draft tokens
        (`from_draft`) or all from the target's own; joined, they are the text `iter()` yields."""
        return self._driven(runs=True)

    def _driven(self, runs: bool) -> Iterator:
        """The pieces, its steps run by `driver` (an engine's generation: its step loop, engine/alone.py);
        a generation made without an engine runs each evaluation directly."""
        return self.driver(self, runs) if self.driver is not None else evaluated(self.steps(runs=runs))

    def steps(self, *, runs: bool = False) -> Generator:
        """The generation as steps (decoding/evals.py): each evaluation yielded as an `Eval` for the
        driver to run (alone, or in one pass with other requests': engine/step_loop.py), and each
        piece of text (a `Run` with `runs`) as it is accepted."""
        start = time.perf_counter()
        tokens = self._token_steps(self._checked_prompt())
        stream = TextStream(self.request.stop)
        self.result.finish_reason = "context"
        try:
            rows = None
            while True:
                try:
                    token = tokens.send(rows)
                except StopIteration:
                    break  # the context is full
                rows = None
                if isinstance(token, Eval):
                    rows = yield token  # the driver runs it and sends its rows back, on to the steps
                    continue
                text, ended = self._text(token, stream, runs, start)
                if text:
                    yield from text if runs else (text,)
                if ended:
                    break
            for piece in stream.finish_runs() if runs else (stream.finish(),):
                if piece:
                    self._add(piece, runs)
                    yield piece
        finally:
            self._ended(tokens, start)

    def _checked_prompt(self) -> list[int]:
        prompt = self.prompt()
        self.result.prompt_tokens = len(prompt)
        if not prompt:  # a raw empty prompt to a model that adds no BOS token: nothing to continue
            raise InvalidSetting("the prompt is empty: give some text for the model to continue")
        if len(prompt) >= self.target.n_ctx:
            raise InvalidSetting(
                f"the prompt is {len(prompt)} tokens but the context holds {self.target.n_ctx}; raise --ctx or shorten it"
            )
        return prompt

    def _token_steps(self, prompt: list[int]) -> Generator:
        """The decoding loop's steps for this request, with its K policy and output grammar."""
        request, proposer = self.request, self.proposer
        self.policy = self.costs.k_policy(request.speculation, request.sampling) if proposer is not None else None
        self._grammar = _grammar(self.target, request, self.stop)
        return generate_steps(
            self.target,
            proposer,
            prompt,
            request.sampling,
            request.speculation,
            self.result.speculation,
            self.policy,
            self._grammar,
            request.logprobs,
            self.prompt_chunk,
            request.max_tokens,
        )

    def _text(self, token: Token, stream: TextStream, runs: bool, start: float) -> tuple[list[Run] | str, bool]:
        """A token's text as it may be shown now (runs with `runs`, else a string; empty while held
        back), kept in the result, and whether the answer ends with it (its `finish_reason` then set):
        at the end of the turn (the token itself not kept), a stop string or max_tokens."""
        request, result = self.request, self.result
        if not result.tokens:
            result.first_token_seconds = time.perf_counter() - start
        if not request.ignore_eos and self.end_of_turn(token.id):
            result.finish_reason = "stop"
            return "", True
        result.tokens.append(token.id)
        if request.logprobs is not None:
            result.scored.append(token)
        piece, special = self._token_piece(token.id)
        if runs:
            text = stream.push_runs(piece, special=special, drafted=token.from_draft)
            for run in text:
                self._add(run, runs)
        elif text := stream.push(piece, special=special):
            self._add(text, runs)
        if stream.stopped:
            result.finish_reason = "stop"
        elif len(result.tokens) >= request.max_tokens:
            result.finish_reason = "length"
        return text, stream.stopped or len(result.tokens) >= request.max_tokens

    def _add(self, piece: Run | str, runs: bool) -> None:
        if runs:
            _add_run(self.result, piece)
        else:
            self.result.text += piece

    def _ended(self, tokens: Generator, start: float) -> None:
        """The generation's end, however it came: statistics kept, grammar closed, costs learned."""
        tokens.close()
        result = self.result
        result.speculation.keep(len(result.tokens))  # count only the drafts the answer kept
        if self._grammar is not None:
            self._grammar.close()
        # a request that shared its steps with others timed them whole: not what its own steps cost
        self.costs.keep_learned(self.request.speculation, self.policy, shared=self.shared)
        result.total_seconds = time.perf_counter() - start


def _grammar(target: LoadedModel, request: Request, stop: Callable[[], bool] | None) -> Grammar | None:
    """The generation's own output grammar: a start of the one compiled when its request was checked, else
    compiled now."""
    if request.compiled_grammar is not None:
        return request.compiled_grammar.started(stop)
    return Grammar.for_model(target, request.grammar, stop) if request.grammar else None


def _add_run(result: Result, run: Run) -> None:
    result.text += run.text
    result.drafted += [run.from_draft] * len(run.text)


def token_runs(target: LoadedModel, tokens: Iterable[Token], stops: Sequence[str] = ()) -> list[Run]:
    """Generated tokens (the loop's, with `from_draft`) as the text they show, in the fewest runs of one
    provenance each: as `Generation.pieces` would have streamed it, stop strings and split UTF-8
    characters included, for code that holds the tokens rather than the stream."""
    stream, runs = TextStream(stops), []
    for token in tokens:
        piece, special = target.token_piece(token.id)
        runs += stream.push_runs(piece, special=special, drafted=token.from_draft)
        if stream.stopped:
            break
    return merge_runs(runs + stream.finish_runs())
