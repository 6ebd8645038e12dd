"""Load a target (and optional draft) and turn requests into streamed text plus statistics.

The Engine is the one face the CLI, the server and the benchmark hold; prompt building
(prompts.py), learned K costs (costs.py), near-tie diagnostics (near_ties.py) and embeddings
(embeddings.py) are its parts, each in its own module."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import partial

import numpy as np

from ollama_spec.decoding.loop import DEFAULT_MAX_SPECULATIVE_TOKENS, SpeculationSettings
from ollama_spec.decoding.proposer_table import build_proposer, head_source
from ollama_spec.decoding.proposers import Proposer
from ollama_spec.engine import near_ties
from ollama_spec.engine.alone import run_alone
from ollama_spec.engine.costs import LearnedCosts
from ollama_spec.engine.embeddings import Embeddings
from ollama_spec.engine.flash_choice import load_target
from ollama_spec.engine.generation import Generation
from ollama_spec.engine.load_plan import (  # noqa: F401 - callers take them from here
    AUTO_PARALLEL,
    DEFAULT_CTX,
    EngineSettings,
    LoadPlan,
    pair_facts,
    plan_pair,
    slot_choices,
)
from ollama_spec.engine.mtp_default import keep_mtp_where_it_pays
from ollama_spec.engine.near_ties import NEAR_TIE_LOGITS, first_difference  # noqa: F401 - callers take them from here
from ollama_spec.engine.prompts import Prompts
from ollama_spec.engine.requests import DEFAULT_MAX_TOKENS, Request, Result  # noqa: F401 - callers take them from here
from ollama_spec.engine.slots import SlotPool
from ollama_spec.engine.step_loop import Sink, StepLoop, Ticket
from ollama_spec.llama.eagle3 import Eagle3Head
from ollama_spec.llama.grammar import Grammar
from ollama_spec.llama.head_sequences import HeadCalibration, HeadSlots
from ollama_spec.llama.load_params import choose_flash_attention
from ollama_spec.llama.model import LoadedModel, LoadSettings
from ollama_spec.llama.mtp import MtpHead
from ollama_spec.llama.passes import piece_size
from ollama_spec.models.architectures import takes_window_cache
from ollama_spec.models.compat import llama3_metadata_fixes, load_kv_overrides
from ollama_spec.models.resolve import ResolvedModel
from ollama_spec.planning.placement import Placement
from ollama_spec.prompting.messages import ChatMessage


class Engine:
    """A loaded target and optional draft. Incompatible drafts are refused before any load."""

    def __init__(
        self,
        target: ResolvedModel,
        draft: ResolvedModel | None = None,
        settings: EngineSettings = EngineSettings(),
        notice: Callable[[str], None] = lambda text: None,
    ):
        """Check the pair and plan it for this machine as it is now (load_plan.plan_pair), then load it: the
        CLI's way. A plan made before (the server's) loads with `Engine.load`."""
        self._open(plan_pair(target, draft, settings, notice=notice), notice)

    @classmethod
    def load(cls, plan: LoadPlan, notice: Callable[[str], None] = lambda text: None) -> Engine:
        """Load a pair checked and planned before (load_plan.py): the engine decides none of it again."""
        engine = cls.__new__(cls)
        engine._open(plan, notice)
        return engine

    def _open(self, plan: LoadPlan, notice: Callable[[str], None]) -> None:
        target, draft, settings = plan.target, plan.draft, plan.settings
        self.target_model, self.draft_model, self.settings = target, draft, settings
        self.notice = notice  # what a user should hear about while it happens (a calibration's pause)
        self.repack, self.placement = plan.repack, settings.placement
        self.slots, memory = plan.fit.slots, plan.fit.plan
        target_gpu_layers = settings.target_gpu_layers
        if memory is not None:
            if target_gpu_layers is None and memory.gpu_layers is not None:
                target_gpu_layers = memory.gpu_layers  # a partial offload when only that fits
            if memory.tensor_split and not self.placement.tensor_split:  # the draft-aware split, not llama.cpp's
                self.placement = replace(self.placement, tensor_split=memory.tensor_split)
        self.flash_attention = choose_flash_attention(
            settings.flash_attention,
            settings.kv_type,
            -1 if settings.target_gpu_layers is None else settings.target_gpu_layers,
            self.slots,
        )
        self.extra_stop_ids = {i for fix in llama3_metadata_fixes(target.info) for i in fix.extra_stop_ids}
        target_settings = _load_settings(
            target,
            plan,
            self.flash_attention,
            -1 if target_gpu_layers is None else target_gpu_layers,
            self.placement,
            window_cache=takes_window_cache(target.info.architecture),
            isolated_rows=True,
            load_mtp=settings.mtp,
        )
        # where "auto" is for a timing to settle (several slots on a CPU), the target's weights are timed
        # both ways first, and the draft follows the target's choice
        self.target, self.flash_choice = load_target(target.path, target_settings, notice)
        self.flash_attention = self.flash_choice.kind
        self.draft = self.head = None
        try:
            if draft is not None:
                draft_settings = _load_settings(draft, plan, self.flash_attention, settings.draft_gpu_layers)
                self.draft = LoadedModel(draft.path, draft_settings)
            if settings.head is not None:
                self.head = Eagle3Head(settings.head, self.target, n_gpu_layers=settings.draft_gpu_layers)
            if settings.mtp:  # the protocol is a head's: it drafts through the same proposers
                self.head = MtpHead(self.target)
        except BaseException:
            self.target.close()
            raise
        # -k auto prices a head's draft steps as a draft model's; its work beside each target pass is
        # inside the verify batches' timings
        drafter = HeadCalibration(self.head) if self.head is not None else self.draft
        self.costs = LearnedCosts(self.target, drafter, settings.placement, notice)  # as asked: see its key
        if settings.mtp and settings.mtp_where_it_pays:
            keep_mtp_where_it_pays(self)
        self.embeddings = Embeddings(self.target)
        loaded = [model for model in (self.target, self.draft) if model is not None]
        if self.head is not None:  # a slot's prefix in host RAM keeps the head's cache too
            loaded.append(HeadSlots(self.head))
        self.pool = SlotPool(loaded, self.slots)
        self.loop = StepLoop(self)  # requests run together: one thread owns the slots and every pass

    def proposer(self, speculation: SpeculationSettings, slot: int = 0) -> Proposer | None:
        """Who proposes tokens for this request: the proposer its settings name, over slot `slot` of
        the draft model, or nobody (one that needs a draft model, and none is loaded)."""
        if self.head is not None:  # the head drafts where a draft model would
            return build_proposer(
                head_source(speculation.proposer, self.settings.mtp),
                self.head.sequence(slot),
                self.target.n_vocab,
                draft_p_min=speculation.draft_p_min,
                ngram_size=speculation.ngram_size,
                head=True,
            )
        draft = self.draft if self.draft is None or self.slots == 1 else self.draft.sequence(slot)
        return speculation.proposer_over(draft, self.target.n_vocab)

    def submit(
        self, request: Request, sink: Sink, *, prompt: Sequence[int] | None = None, runs: bool = False
    ) -> Ticket:
        """Run `request` in the step loop beside the other requests (step_loop.py), its answer to
        `sink`; `prompt`: its tokens when the caller has them already (else built here)."""
        return self.loop.submit(request, list(prompt or request.tokens or self.prompt_tokens(request)), sink, runs=runs)

    def close(self) -> None:
        self.loop.close()
        self.costs.save()  # what this session measured, for the next one
        self.embeddings.close()
        if self.head is not None:
            self.head.close()
        for model in (self.draft, self.target):
            if model is not None:
                model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def prompts(self) -> Prompts:
        """Prompt building for the target (it holds nothing of its own: made where it is used)."""
        return Prompts(self.target, self.target_model)

    def prompt_tokens(self, request: Request) -> list[int]:
        """The request as target tokens: chat-templated unless raw or the model has no template."""
        return self.prompts.tokens(request)

    def templated_tokens(self, text: str) -> list[int]:
        """Text a template wrote, as target tokens: its special tokens read as such, and one BOS."""
        return self.prompts.templated_tokens(text)

    def chat_text(
        self, messages: list[ChatMessage], tools: Sequence[dict] = (), think: bool | None = None
    ) -> str | None:
        """`messages` (and the `tools` offered) through the model's chat template, ending with the
        assistant's cue; None without a template."""
        return self.prompts.chat_text(messages, tools, think)

    def clear_cache(self) -> None:
        """Forget what the KV caches hold: the next request evaluates its whole prompt (fair timing)."""
        for model in (self.target, self.draft):
            if model is not None:
                for seq in range(self.slots):
                    model.clear_sequence(seq)

    def is_end_of_turn(self, token: int) -> bool:
        return self.target.is_end_of_generation(token) or token in self.extra_stop_ids

    def greedy_margins(
        self, prompt: list[int], tokens: list[int], chunk: int = 64, request: Request | None = None
    ) -> list[float]:
        """The target's top-1 minus top-2 logit at each position of `tokens` (near_ties.greedy_margins)."""
        return near_ties.greedy_margins(self.target, prompt, tokens, chunk, request)

    def chosen_in_a_batch(
        self,
        prompt: list[int],
        tokens: list[int],
        at: int,
        token: int,
        max_batch: int = DEFAULT_MAX_SPECULATIVE_TOKENS + 1,
        request: Request | None = None,
    ) -> int | None:
        """The size of a batch in which the target itself picks `token` for `tokens[at]`, or None
        (near_ties.chosen_in_a_batch)."""
        return near_ties.chosen_in_a_batch(self.target, prompt, tokens, at, token, max_batch, request)

    def chosen_as_batched(
        self,
        prompt: list[int],
        tokens: list[int],
        batches: Sequence[tuple[int, int]],
        at: int,
        token: int,
        request: Request | None = None,
    ) -> bool:
        """Does the target pick `token` for `tokens[at]` on a cache built in a run's own `batches`
        (near_ties.chosen_as_batched)?"""
        return near_ties.chosen_as_batched(self.target, prompt, tokens, batches, at, token, request)

    def embed(self, text: str | Sequence[int], *, truncate: bool = True) -> tuple[np.ndarray, int]:
        """The target's embedding of `text` (or of token ids), not normalized, and the tokens it read.

        Too long a text is cut to its first tokens when `truncate`, else refused."""
        return self.embeddings.embed(text, truncate=truncate)

    def grammar(self, gbnf: str) -> Grammar:
        """A grammar over the target's vocabulary; InvalidSetting when llama.cpp cannot parse it."""
        return Grammar.for_model(self.target, gbnf)

    def generate(
        self, request: Request, *, use_draft: bool = True, slot: int = 0, stop: Callable[[], bool] | None = None
    ) -> Generation:
        """The answer in sequence `slot` of both models, run as it is iterated: as the step loop with one
        slot, on the iterating thread when the loop runs nothing else, else beside the loop's other
        requests on its thread (engine/alone.py); `use_draft=False` runs the loaded target alone (the
        baseline); `stop`: whether the request was cancelled."""
        generation = Generation(
            self.target if self.slots == 1 else self.target.sequence(slot),
            request,
            partial(self.prompt_tokens, request),
            end_of_turn=self.is_end_of_turn,
            proposer=self.proposer(request.speculation, slot) if use_draft else None,
            costs=self.costs,
            stop=stop,
        )
        if self.slots > 1:  # a long prompt is read a pass's piece at a time, beside the other slots' steps
            generation.prompt_chunk = piece_size(self.target.n_batch, self.slots)
            if generation.proposer is not None:  # and so is what the draft missed at K=0 (its first token too)
                generation.proposer.catch_up = generation.prompt_chunk + 1
        generation.driver = partial(run_alone, self.loop, slot)  # the one step function, for everyone
        return generation


def _load_settings(
    model: ResolvedModel,
    plan: LoadPlan,
    flash_attention: str,
    gpu_layers: int,
    placement: Placement = Placement(),
    *,
    window_cache: bool = False,
    isolated_rows: bool = False,  # the target's: its rows are the answer (llama/passes.py)
    load_mtp: bool = False,
) -> LoadSettings:
    """What one model of the pair loads with: the plan's context, slots and repack choice."""
    settings = plan.settings
    return LoadSettings(
        n_ctx=settings.n_ctx,
        n_gpu_layers=gpu_layers,
        n_threads=settings.n_threads,
        kv_overrides=load_kv_overrides(model.info),
        kv_type=settings.kv_type,
        use_extra_bufts=plan.repack.enabled,
        flash_attention=flash_attention,
        placement=placement,
        lora_adapters=model.adapter_paths,
        window_cache=window_cache,
        isolated_rows=isolated_rows,
        load_mtp=load_mtp,
        n_seq=plan.fit.slots,
    )
