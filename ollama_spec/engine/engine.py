"""Load a target (and optional draft) and turn requests into streamed text plus statistics.

The Engine is the one face the CLI, the server and the benchmark hold; prompt building
(prompts.py), learned K costs (costs.py), near-tie diagnostics (near_ties.py) and embeddings
(embeddings.py) are its parts, each in its own module."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import numpy as np

from ollama_spec.decoding.loop import DEFAULT_MAX_SPECULATIVE_TOKENS, SpeculationSettings
from ollama_spec.decoding.proposer_table import build_proposer
from ollama_spec.decoding.proposers import Proposer
from ollama_spec.engine import near_ties
from ollama_spec.engine.costs import LearnedCosts
from ollama_spec.engine.embeddings import Embeddings
from ollama_spec.engine.generation import Generation
from ollama_spec.engine.near_ties import NEAR_TIE_LOGITS, first_difference  # noqa: F401 - callers take them from here
from ollama_spec.engine.prompts import Prompts
from ollama_spec.engine.requests import DEFAULT_MAX_TOKENS, Request, Result  # noqa: F401 - callers take them from here
from ollama_spec.engine.slots import SlotPool
from ollama_spec.engine.step_loop import Sink, StepLoop, Ticket
from ollama_spec.errors import InvalidSetting
from ollama_spec.llama import backends
from ollama_spec.llama.backends import llama_cpp_knows
from ollama_spec.llama.canary import decide_repack
from ollama_spec.llama.eagle3 import Eagle3Head
from ollama_spec.llama.grammar import Grammar
from ollama_spec.llama.head_sequences import HeadCalibration, HeadSlots
from ollama_spec.llama.load_params import choose_flash_attention
from ollama_spec.llama.model import LoadedModel, LoadSettings
from ollama_spec.llama.mtp import MtpHead
from ollama_spec.llama.passes import piece_size
from ollama_spec.llama.rpc import remote_devices
from ollama_spec.models.architectures import is_hybrid, is_recurrent, takes_window_cache
from ollama_spec.models.compat import llama3_metadata_fixes, load_kv_overrides, require_compatible
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.models.heads import is_head
from ollama_spec.models.resolve import ResolvedModel
from ollama_spec.models.usable import require_usable
from ollama_spec.planning.context import ContextChoice
from ollama_spec.planning.fit import Fit, PairFacts, fit_pair
from ollama_spec.planning.placement import Placement
from ollama_spec.prompting.messages import ChatMessage

DEFAULT_CTX = 4096
AUTO_PARALLEL = 4  # as llama-server's and Ollama's defaults go: more slots than clients cost only memory


@dataclass(frozen=True)
class EngineSettings:
    n_ctx: int = DEFAULT_CTX
    target_gpu_layers: int | None = None  # None: all, or what the memory plan says fits
    draft_gpu_layers: int = -1
    n_threads: int | None = None
    kv_type: str = "f16"
    memory_check: bool = True
    repack: bool | None = None  # llama.cpp's repacked CPU weights; None: canary.decide_repack chooses
    flash_attention: str = "auto"  # "on", "off", or "auto": off on a CPU, llama.cpp's choice on a GPU
    placement: Placement = Placement()  # the target's RPC servers and GPU split; the draft stays local
    # Slots: requests that run together, each its own sequence of n_ctx tokens in both caches
    # (serve --parallel); None: as many as the memory plan fits, up to AUTO_PARALLEL
    parallel: int | None = 1
    # An EAGLE-3 head's GGUF: it drafts for the target (in place of a draft model), reading its hidden states
    head: Path | None = None
    # Draft with the target's own MTP (NextN) layers (llama/mtp.py), in place of a draft model
    mtp: bool = False

    def __post_init__(self) -> None:
        if self.n_ctx < 1:
            raise InvalidSetting(f"--ctx must be a positive number of tokens, got {self.n_ctx}")
        if self.parallel is not None and self.parallel < 1:
            raise InvalidSetting(f"--parallel must be at least 1, got {self.parallel}")


def slot_choices(target: ResolvedModel, settings: EngineSettings) -> list[int]:
    """The slot counts to try, most first: --parallel, else AUTO_PARALLEL down to 1; one for a recurrent
    target (its state cannot be cut back per sequence as a KV cache can)."""
    if is_recurrent(target.info.architecture) or is_hybrid(target.info.architecture):
        return [1]
    return [settings.parallel] if settings.parallel else list(range(AUTO_PARALLEL, 0, -1))


def as_head(draft: ResolvedModel | None, settings: EngineSettings) -> tuple[ResolvedModel | None, EngineSettings]:
    """A draft whose GGUF is an EAGLE-3 head (named by --draft, --pair, a preset's DRAFT or auto) drafts as the
    head (EngineSettings.head), not as a draft model: the draft model to load, and the settings."""
    if draft is None or not draft.info.is_eagle3_head:
        return draft, settings
    if settings.head is not None:
        raise InvalidSetting(f"{draft.name} is an EAGLE-3 head and another head is set: choose one")
    return None, replace(settings, head=draft.path)


def pair_facts(
    target: ResolvedModel,
    draft: ResolvedModel | None,
    settings: EngineSettings,
    repack: bool | None = None,
    placement: Placement | None = None,
) -> PairFacts:
    """What the memory plan reads of this pair as these settings load it (planning/fit.py decides the fit)."""
    placement = settings.placement if placement is None else placement
    # an EAGLE-3 head is planned as a draft model of one layer is, with the rows its target captures for it
    drafter = draft.loaded_info if draft else read_model_info(settings.head) if settings.head else None
    return PairFacts(
        target.loaded_info,
        drafter,
        settings.kv_type,
        repack=decide_repack(settings.repack).enabled if repack is None else repack,
        features=backends.cpu_features(),
        flash_attention=None if settings.flash_attention == "auto" else settings.flash_attention == "on",
        tensor_split=placement.tensor_split,
        remote=tuple(remote_devices(placement.rpc_servers)),
        main_device=placement.main_device,
    )


class Engine:
    """A loaded target and optional draft. Incompatible drafts are refused before any load."""

    def __init__(
        self,
        target: ResolvedModel,
        draft: ResolvedModel | None = None,
        settings: EngineSettings = EngineSettings(),
        notice: Callable[[str], None] = lambda text: None,
        fit: Fit | None = None,
    ):
        """`fit`: the context, slots and memory plan decided before (the server's); None: decided here, for
        this machine as it is now (the CLI)."""
        if draft is not None and settings.head is None and is_head(draft.info):
            # a head named as the draft (--draft, a pair, a preset, the store's pick) drafts as a head
            require_compatible(target.name, target.info, draft.name, draft.info)
            draft, settings = None, replace(settings, head=draft.path)
        self.target_model, self.draft_model, self.settings = target, draft, settings
        self.notice = notice  # what a user should hear about while it happens (a calibration's pause)
        require_usable(target.name, target.info, "target", llama_cpp_knows)
        if settings.head is not None and draft is not None:
            raise InvalidSetting("a draft model and an EAGLE-3 head cannot both draft: choose one")
        if settings.mtp and (draft is not None or settings.head is not None):
            raise InvalidSetting("the target's MTP layers draft alone: leave out the draft model or head")
        if (settings.head is not None or settings.mtp) and (
            is_recurrent(target.info.architecture) or is_hybrid(target.info.architecture)
        ):
            drafter = "an EAGLE-3 head" if settings.head is not None else "its MTP layers"
            raise InvalidSetting(
                f"{target.name} is a recurrent or hybrid model: its cache cannot be cut back after each "
                f"step, so {drafter} cannot draft for it"
            )
        if draft is not None:
            require_usable(draft.name, draft.info, "draft", llama_cpp_knows)
            require_compatible(target.name, target.info, draft.name, draft.info)
        draft, settings = as_head(draft, settings)
        self.settings = settings
        target_gpu_layers = settings.target_gpu_layers
        self.repack = decide_repack(settings.repack)
        self.placement = settings.placement
        fit = fit or self._fit(target, draft)
        self.slots, plan = fit.slots, fit.plan
        if fit.n_ctx != settings.n_ctx:
            self.settings = settings = replace(settings, n_ctx=fit.n_ctx)
        if plan is not None:
            if target_gpu_layers is None and plan.gpu_layers is not None:
                target_gpu_layers = plan.gpu_layers  # a partial offload when only that fits
            if plan.tensor_split and not self.placement.tensor_split:  # the draft-aware split, not llama.cpp's
                self.placement = replace(self.placement, tensor_split=plan.tensor_split)
        self.flash_attention = choose_flash_attention(
            settings.flash_attention,
            settings.kv_type,
            -1 if settings.target_gpu_layers is None else settings.target_gpu_layers,
            self.slots,
        )
        self.extra_stop_ids = {i for fix in llama3_metadata_fixes(target.info) for i in fix.extra_stop_ids}
        self.target = self._load(
            target,
            -1 if target_gpu_layers is None else target_gpu_layers,
            self.placement,
            window_cache=takes_window_cache(target.info.architecture),
            isolated_rows=True,
            load_mtp=settings.mtp,
        )
        self.draft = self.head = None
        try:
            if draft is not None:
                self.draft = self._load(draft, settings.draft_gpu_layers)
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
        self.embeddings = Embeddings(self.target)
        loaded = [model for model in (self.target, self.draft) if model is not None]
        if self.head is not None:  # a slot's prefix in host RAM keeps the head's cache too
            loaded.append(HeadSlots(self.head))
        self.pool = SlotPool(loaded, self.slots)
        self.loop = StepLoop(self)  # requests run together: one thread owns the slots and every pass

    def _fit(self, target: ResolvedModel, draft: ResolvedModel | None) -> Fit:
        """The most slots that fit at the asked context (each holds n_ctx tokens of both models) on this
        machine now; without the memory check, the first slot count asked."""
        asked = slot_choices(target, self.settings)
        if not self.settings.memory_check:
            return Fit(self.settings.n_ctx, asked[0])
        devices, notes = backends.discover_devices()
        facts = pair_facts(target, draft, self.settings, self.repack.enabled, self.placement)
        return fit_pair(facts, ContextChoice(self.settings.n_ctx, False, "asked"), asked, devices, notes)

    def _load(
        self,
        model: ResolvedModel,
        gpu_layers: int,
        placement: Placement = Placement(),
        *,
        window_cache: bool = False,
        isolated_rows: bool = False,  # the target's: its rows are the answer (llama/passes.py)
        load_mtp: bool = False,
    ) -> LoadedModel:
        return LoadedModel(
            model.path,
            LoadSettings(
                n_ctx=self.settings.n_ctx,
                n_gpu_layers=gpu_layers,
                n_threads=self.settings.n_threads,
                kv_overrides=load_kv_overrides(model.info),
                kv_type=self.settings.kv_type,
                use_extra_bufts=self.repack.enabled,
                flash_attention=self.flash_attention,
                placement=placement,
                lora_adapters=model.adapter_paths,
                window_cache=window_cache,
                isolated_rows=isolated_rows,
                load_mtp=load_mtp,
                n_seq=self.slots,
            ),
        )

    def proposer(self, speculation: SpeculationSettings, slot: int = 0) -> Proposer | None:
        """Who proposes tokens for this request: the proposer its settings name, over slot `slot` of
        the draft model, or nobody (one that needs a draft model, and none is loaded)."""
        if self.head is not None:  # the head drafts where a draft model would
            return build_proposer(
                speculation.proposer,
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
        """The answer in sequence `slot` of both models, run here as it is iterated (a request alone;
        beside others, `submit` runs it in the step loop); `use_draft=False` runs the loaded target
        alone (the baseline); `stop`: whether the request was cancelled."""
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
        return generation
