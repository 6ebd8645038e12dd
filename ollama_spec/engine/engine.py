"""Load a target (and optional draft) and turn requests into streamed text plus statistics."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from ollama_spec.models.architectures import takes_window_cache
from ollama_spec.llama.calibration import StepCostCache, calibration_context, cost_key, measure_step_costs
from ollama_spec.llama.canary import decide_repack
from ollama_spec.prompting.template import TemplateRefused, render_chat
from ollama_spec.prompting.messages import ChatMessage, name_tool_answers, system_folded
from ollama_spec.models.compat import llama3_metadata_fixes, load_kv_overrides, require_compatible
from ollama_spec.llama.embedding import Embedder
from ollama_spec.errors import InvalidSetting
from ollama_spec.engine.generation import DEFAULT_MAX_TOKENS, Generation, Request, Result  # noqa: F401 - callers take them from here
from ollama_spec.llama.grammar import Grammar
from ollama_spec.decoding.k_policy import AutoK, FixedK, KPolicy, StepCosts
from ollama_spec.planning.memory import ensure_fits, plan_memory
from ollama_spec.decoding.penalties import adjusted
from ollama_spec.planning.placement import Placement
from ollama_spec.decoding.proposers import DraftModelProposer, NgramProposer, Proposer, keep_common_prefix
from ollama_spec.models.resolve import ResolvedModel
from ollama_spec.llama.rpc import remote_devices
from ollama_spec.llama.model import LoadedModel, LoadSettings, choose_flash_attention
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.decoding.loop import DEFAULT_MAX_SPECULATIVE_TOKENS, SpeculationSettings
from ollama_spec.prompting.tools import template_takes_tools, tools_in_messages
from ollama_spec.models.usable import require_usable

DEFAULT_CTX = 4096
# Greedy outputs that part where the target's two best logits are closer than this are
# floating-point near-ties: a batch of K+1 and a single token round differently.
NEAR_TIE_LOGITS = 0.02


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Where two token lists first differ (the shorter one's length when one extends the other); None when equal."""
    if list(a) == list(b):
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


# What the target reads while its step costs are timed: ordinary text (only its length matters).
CALIBRATION_TEXT = "The quick brown fox jumps over the lazy dog while the sun sets slowly over the hills. "


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

    def __post_init__(self) -> None:
        if self.n_ctx < 1:
            raise InvalidSetting(f"--ctx must be a positive number of tokens, got {self.n_ctx}")


class Engine:
    """A loaded target and optional draft. Incompatible drafts are refused before any load."""

    def __init__(
        self, target: ResolvedModel, draft: ResolvedModel | None = None, settings: EngineSettings = EngineSettings(),
        notice: Callable[[str], None] = lambda text: None,
    ):
        self.target_model, self.draft_model, self.settings = target, draft, settings
        self.notice = notice  # what a user should hear about while it happens (a calibration's pause)
        require_usable(target.name, target.info, "target")
        if draft is not None:
            require_usable(draft.name, draft.info, "draft")
            require_compatible(target.name, target.info, draft.name, draft.info)
        target_gpu_layers = settings.target_gpu_layers
        self.repack = decide_repack(settings.repack)
        self.flash_attention = choose_flash_attention(settings.flash_attention, settings.kv_type,
                                                      -1 if settings.target_gpu_layers is None else settings.target_gpu_layers)
        self.placement = settings.placement
        if settings.memory_check:
            plan = plan_memory(target.loaded_info, draft.loaded_info if draft else None, settings.n_ctx,
                               settings.kv_type,
                               repack=self.repack.enabled,
                               flash_attention=None if settings.flash_attention == "auto" else self.flash_attention == "on",
                               tensor_split=self.placement.tensor_split,
                               remote=remote_devices(self.placement.rpc_servers), main_device=self.placement.main_device)
            ensure_fits(plan)
            if target_gpu_layers is None and plan.gpu_layers is not None:
                target_gpu_layers = plan.gpu_layers  # a partial offload when only that fits
            if plan.tensor_split and not self.placement.tensor_split:  # the draft-aware split, not llama.cpp's
                self.placement = replace(self.placement, tensor_split=plan.tensor_split)
        self.extra_stop_ids = {i for fix in llama3_metadata_fixes(target.info) for i in fix.extra_stop_ids}
        self.target = self._load(target, -1 if target_gpu_layers is None else target_gpu_layers, self.placement,
                                 window_cache=takes_window_cache(target.info.architecture))
        self.draft = None
        self._cost_cache = StepCostCache()
        self._learned_costs: dict[str, StepCosts] = {}  # by cost key: refined by AutoK during requests
        self._last_policies: dict[str, AutoK] = {}  # by cost key: what the last request learned of α and margins
        self._embedder: Embedder | None = None  # made on the first embedding request
        if draft is not None:
            try:
                self.draft = self._load(draft, settings.draft_gpu_layers)
            except BaseException:
                self.target.close()
                raise

    def _load(self, model: ResolvedModel, gpu_layers: int, placement: Placement = Placement(), *,
              window_cache: bool = False) -> LoadedModel:
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
            ),
        )

    def proposer(self, speculation: SpeculationSettings) -> Proposer | None:
        """Who proposes tokens for this request: n-gram lookup, the draft model, or nobody."""
        if speculation.proposer == "ngram":
            return NgramProposer(speculation.ngram_size)
        if self.draft is None:
            return None
        return DraftModelProposer(self.draft, self.target.n_vocab, speculation.draft_p_min)

    def k_policy(self, speculation: SpeculationSettings, sampling: SamplingSettings) -> KPolicy:
        """Fixed K, or for "auto" a policy seeded with this machine's measured step costs."""
        if not speculation.auto:
            return FixedK(speculation.num_speculative_tokens)
        draft, k_max = self._cost_draft(speculation), speculation.max_speculative_tokens
        key, calibrated = self._cost_key(draft), self.calibrated_costs(draft, k_max)
        # Greedy text does not depend on K; a seeded sample does, so K must not follow the clock.
        # A draft model reports its margin for each token, so it can stop token by token.
        learn = sampling.greedy or sampling.seed is None
        costs = self._learned_or(calibrated, key) if learn else calibrated
        policy = AutoK(costs, learn_costs=learn, confidence_stops=speculation.proposer == "draft",
                       calibrated=calibrated)
        earlier, learned = self._last_policies.get(key), self._cost_cache.get_acceptance(key)
        if learn and earlier is not None:  # a seeded sample starts from the prior: its text must not depend on history
            policy.carry_over(earlier)
        elif learn and learned is not None and policy.confidence_stops:
            policy.seed_acceptance(learned)
        return policy

    def keep_learned_costs(self, speculation: SpeculationSettings, policy: KPolicy | None) -> None:
        """After a request: the costs an AutoK refined seed the next request's, and the cache on close."""
        if isinstance(policy, AutoK) and policy.learn_costs:
            key = self._cost_key(self._cost_draft(speculation))
            self._last_policies[key] = policy
            base = self._learned_costs.get(key) or self._cost_cache.get_learned(key) or self._cost_cache.get(key)
            self._learned_costs[key] = _overlay(base, policy.costs)

    def step_costs(self, draft: LoadedModel | None, k_max: int) -> StepCosts:
        """Draft step and verify batch costs up to k_max + 1 tokens: as learned by earlier requests (this
        process's, else the last one's), else as calibrated."""
        return self._learned_or(self.calibrated_costs(draft, k_max), self._cost_key(draft))

    def _learned_or(self, calibrated: StepCosts, key: str) -> StepCosts:
        """What requests learned (this process's, else the last one's) up to calibrated's K_max, else calibrated."""
        learned = self._learned_costs.get(key) or self._cost_cache.get_learned(key)
        if learned is None or learned.k_max < calibrated.k_max:
            return calibrated
        return StepCosts(learned.draft_step_s, learned.verify_s[: calibrated.k_max + 1])

    def calibrated_costs(self, draft: LoadedModel | None, k_max: int) -> StepCosts:
        """The costs as timed on this machine, batch size by batch size (cached, else measured now).

        Kept apart from what requests learn, which is a line: the calibration keeps the bumps of
        llama.cpp's kernels that AutoK takes free tokens from."""
        key = self._cost_key(draft)
        costs = self._cost_cache.get(key)
        if costs is None or costs.k_max < k_max:
            self.notice("timing this machine's draft and verify steps for -k auto (once per pair and setup, then "
                        "cached)")
            filler = self.target.tokenize(CALIBRATION_TEXT, add_bos=self.target.add_bos, special=False)
            context = calibration_context(self.target.n_ctx, k_max, filler)
            costs = measure_step_costs(self.target, draft, k_max, context)
            self._cost_cache.put(key, costs)
            self._learned_costs.pop(key, None)
        return StepCosts(costs.draft_step_s, costs.verify_s[: k_max + 1])

    def _cost_draft(self, speculation: SpeculationSettings) -> LoadedModel | None:
        return None if speculation.proposer == "ngram" else self.draft

    def _cost_key(self, draft: LoadedModel | None) -> str:
        # a target spread over RPC servers or GPUs has other step costs than one on this machine's default;
        # keyed by what was asked, not by the split the memory plan derived from this moment's free memory
        asked = self.settings.placement
        extra = {} if asked.is_default else {"placement": asked}
        if self.target.settings.lora_adapters:  # an adapter adds a little to every step of its layers
            extra["adapters"] = ",".join(str(p) for p in self.target.settings.lora_adapters)
        return cost_key(self.target.path, draft.path if draft else None, threads=self.target.n_threads,
                        target_gpu_layers=self.target.settings.n_gpu_layers,
                        draft_gpu_layers=draft.settings.n_gpu_layers if draft else None, kv_type=self.settings.kv_type,
                        flash_attention=self.flash_attention, **extra)

    def close(self) -> None:
        for key, costs in self._learned_costs.items():  # what this session measured, for the next one
            self._cost_cache.put_learned(key, _overlay(self._cost_cache.get_learned(key), costs))
        for key, policy in self._last_policies.items():
            if policy.confidence_stops:
                self._cost_cache.put_acceptance(key, policy.by_margin.bands)
        self._learned_costs.clear()
        self._last_policies.clear()
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        for model in (self.draft, self.target):
            if model is not None:
                model.close()

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def prompt_tokens(self, request: Request) -> list[int]:
        """The request as target tokens: chat-templated unless raw or the model has no template."""
        if request.tokens:
            return list(request.tokens)
        if request.suffix is not None:
            return self._infill_tokens(request.prompt, request.suffix)
        if request.raw and not request.messages:
            return self.target.tokenize(request.prompt, add_bos=self.target.add_bos, special=False)
        messages = request.conversation(self.target_model.system)
        text = None if request.raw else self.chat_text(messages, request.tools, request.think)
        if text is None:
            text = "\n\n".join(m.content for m in messages if m.content)
            return self.target.tokenize(text, add_bos=self.target.add_bos, special=False)
        return self.templated_tokens(text)

    def templated_tokens(self, text: str) -> list[int]:
        """Text a template wrote, as target tokens: its special tokens read as such, and one BOS."""
        info = self.target_model.info
        bos = info.token_text(info.bos_id) or ""
        add_bos = self.target.add_bos and not (bos and text.startswith(bos))
        return self.target.tokenize(text, add_bos=add_bos, special=True)

    def _infill_tokens(self, prefix: str, suffix: str) -> list[int]:
        """Fill in the middle as llama.cpp's server lays it out: BOS, the prefix marker and the text
        before the gap, the suffix marker and the text after it, then the middle marker."""
        markers = self.target.fill_in_the_middle_tokens()
        if markers is None:
            raise InvalidSetting(f"{self.target_model.name} has no fill-in-the-middle tokens: it cannot complete "
                                 "between a prompt and a suffix (code models such as qwen2.5-coder can)")
        pre, suf, mid = markers
        tokens = [self.target.bos_token] if self.target.add_bos else []
        tokenize = self.target.tokenize
        return [*tokens, pre, *tokenize(prefix, add_bos=False, special=False), suf,
                *tokenize(suffix, add_bos=False, special=False), mid]

    def chat_text(self, messages: list[ChatMessage], tools: Sequence[dict] = (),
                  think: bool | None = None) -> str | None:
        """`messages` (and the `tools` offered) through the model's chat template, ending with the
        assistant's cue; None without a template."""
        info = self.target_model.info
        if not info.chat_template:
            return None

        def render(conversation: list[ChatMessage]) -> str:
            return render_chat(info.chat_template, [m.for_template() for m in name_tool_answers(conversation)],
                               bos_token=info.token_text(info.bos_id) or "",
                               eos_token=info.token_text(info.eos_id) or "", tools=list(tools) or None, think=think)

        if tools and not template_takes_tools(info.chat_template):
            messages, tools = tools_in_messages(messages, list(tools)), ()
        try:
            return render(messages)
        except TemplateRefused:
            folded = system_folded(messages)
            if folded is None:
                raise
            return render(folded)

    def clear_cache(self) -> None:
        """Forget what the KV caches hold: the next request evaluates its whole prompt (fair timing)."""
        for model in (self.target, self.draft):
            if model is not None:
                model.truncate(0)

    def is_end_of_turn(self, token: int) -> bool:
        return self.target.is_end_of_generation(token) or token in self.extra_stop_ids

    def greedy_margins(self, prompt: list[int], tokens: list[int], chunk: int = 64,
                       request: Request | None = None) -> list[float]:
        """The target's top-1 minus top-2 logit at each position of `tokens` after `prompt`, as the
        `request` chose among them (its penalties and output grammar applied).

        Tells a floating-point near-tie (batched and single-token evaluation may round a
        0.001-logit gap either way) from a real divergence when greedy outputs differ.
        """
        target = self.target
        target.truncate(0)
        if len(prompt) > 1:
            target.eval(prompt[:-1])
        inputs = [prompt[-1], *tokens[:-1]]
        margins: list[float] = []
        with _RowsAsChosen(self, request, prompt) as chosen:
            for start in range(0, len(inputs), chunk):  # chunks bound the logits held at once
                for row, token in zip(target.eval(inputs[start : start + chunk], logits="all"),
                                      tokens[start : start + chunk]):
                    top2 = np.sort(chosen.row(row))[-2:]  # under a grammar, one allowed token is no tie: inf
                    margins.append(float(top2[1] - top2[0]) if np.isfinite(top2).all() else float("inf"))
                    chosen.advance(token)
        return margins

    def chosen_in_a_batch(self, prompt: list[int], tokens: list[int], at: int, token: int,
                          max_batch: int = DEFAULT_MAX_SPECULATIVE_TOKENS + 1,
                          request: Request | None = None) -> int | None:
        """The size of a batch in which the target itself picks `token` for `tokens[at]`, or None.

        llama.cpp's kernels for one token and for a batch round differently (tiled matrix products,
        quantized blocks), by up to tenths of a logit after many layers. When a greedy speculative
        output parts from the target alone's, this tells that rounding, which the verify batch
        makes, from a verification error: it evaluates the position in every batch of 2..max_batch
        tokens and every place in it, as verify batches hold it (the `request`'s penalties and
        output grammar applied, as the loop applies them).
        """
        target, seq = self.target, [*prompt, *tokens]
        position = len(prompt) - 1 + at  # the input whose logits choose tokens[at]
        with _RowsAsChosen(self, request, prompt) as chosen:
            for earlier in tokens[:at]:
                chosen.advance(earlier)
            keep_common_prefix(target, seq)
            for size in range(2, max_batch + 1):
                for row in range(size):
                    start = position - row
                    if start < 0 or start + size > len(seq):
                        continue
                    target.truncate(min(target.n_past, start))
                    if target.n_past < start:
                        target.eval(seq[target.n_past : start])
                    picked = int(np.argmax(chosen.row(target.eval(seq[start : start + size], logits="all")[row])))
                    target.truncate(start)
                    if picked == token:
                        return size
        return None

    def embed(self, text: str | Sequence[int], *, truncate: bool = True) -> tuple[np.ndarray, int]:
        """The target's embedding of `text` (or of token ids), not normalized, and the tokens it read.

        Too long a text is cut to its first tokens when `truncate`, else refused."""
        if self._embedder is None:
            self._embedder = Embedder(self.target)
        if isinstance(text, str):
            tokens = self.target.tokenize(text, add_bos=self.target.add_bos, special=False)
        else:
            tokens = list(text)
            if any(not 0 <= token < self.target.n_vocab for token in tokens):
                raise InvalidSetting(f"token ids must be in 0..{self.target.n_vocab - 1}")
        if len(tokens) > self._embedder.max_tokens:
            if not truncate:
                raise InvalidSetting(f"the input is {len(tokens)} tokens, more than the {self._embedder.max_tokens} "
                                     "an embedding reads; shorten it or allow truncation")
            tokens = tokens[: self._embedder.max_tokens]
        return self._embedder.embed(tokens), len(tokens)

    def grammar(self, gbnf: str) -> Grammar:
        """A grammar over the target's vocabulary; InvalidSetting when llama.cpp cannot parse it."""
        return Grammar.for_model(self.target, gbnf)

    def generate(self, request: Request, *, use_draft: bool = True) -> Generation:
        """Stream the answer; `use_draft=False` runs the loaded target alone (the baseline)."""
        return Generation(self, request, use_draft)


def _overlay(base: StepCosts | None, learned: StepCosts) -> StepCosts:
    """`learned` over `base`: a policy learns the costs up to its own K_max; longer batches keep theirs."""
    if base is None or base.k_max <= learned.k_max:
        return learned
    return StepCosts(learned.draft_step_s, learned.verify_s + base.verify_s[learned.k_max + 1:])


class _RowsAsChosen:
    """A greedy request's rows as its loop chose from them: penalized by the text before each row and
    masked by its output grammar after it (`advance` moves past each emitted token). Without a
    request, rows as they are."""

    def __init__(self, engine: Engine, request: Request | None, prompt: list[int]):
        self.text = list(prompt)
        self.penalties = request.sampling.penalties if request is not None else None
        self.grammar = engine.grammar(request.grammar) if request is not None and request.grammar else None

    def row(self, logits: np.ndarray) -> np.ndarray:
        if self.penalties is not None and self.penalties.active:
            logits = adjusted(logits, self.penalties.window(self.text), self.penalties)
        return self.grammar.mask(logits) if self.grammar is not None else logits

    def advance(self, token: int) -> None:
        self.text.append(token)
        if self.grammar is not None and self.grammar.allows(token):
            self.grammar.accept(token)

    def __enter__(self) -> _RowsAsChosen:
        return self

    def __exit__(self, *exc) -> None:
        if self.grammar is not None:
            self.grammar.close()
