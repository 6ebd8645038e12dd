"""A pair checked and planned before it loads: whether each model can run in its role, whether the draft
(or EAGLE-3 head, or the target's MTP layers) can draft for the target, the repack choice and the fit. Made
once, by whoever plans the pair (the CLI just before loading, the server's scheduler before making room),
and carried as a value to Engine.load, which decides none of it again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from ollama_spec.engine.mtp_default import let_mtp_go
from ollama_spec.errors import InsufficientMemory, InvalidSetting
from ollama_spec.llama import backends
from ollama_spec.llama.backends import llama_cpp_knows
from ollama_spec.llama.canary import RepackDecision, decide_repack
from ollama_spec.llama.rpc import remote_devices
from ollama_spec.models.architectures import is_hybrid, is_recurrent
from ollama_spec.models.compat import require_compatible
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.models.heads import is_head
from ollama_spec.models.resolve import ResolvedModel
from ollama_spec.models.usable import require_usable
from ollama_spec.planning.context import ContextChoice
from ollama_spec.planning.fit import Fit, PairFacts, fit_pair
from ollama_spec.planning.placement import Placement

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
    # Draft with the target's own MTP (NextN) layers (llama/mtp.py), in place of a draft model; chosen by
    # default (`mtp_where_it_pays`), only where their priced goodput beats the target alone (mtp_default.py)
    mtp: bool = False
    mtp_where_it_pays: bool = False
    # Why the MTP layers chosen by default were let go (they do not fit, or would not pay): the target runs
    # alone, and the server reports that, not the plan; "" where they were not
    mtp_let_go: str = ""

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
        mtp=settings.mtp,
    )


@dataclass(frozen=True)
class LoadPlan:
    """What Engine.load loads: the target, the draft model (None: none, or a head drafts: `settings.head`),
    the settings it loads with (the fitted context), the repack choice and the fit (slots, memory plan)."""

    target: ResolvedModel
    draft: ResolvedModel | None
    settings: EngineSettings
    repack: RepackDecision
    fit: Fit


def require_target(target: ResolvedModel) -> None:
    """UnusableModel unless `target` can run as a target here."""
    require_usable(target.name, target.info, "target", llama_cpp_knows)


def check_drafter(
    target: ResolvedModel, draft: ResolvedModel | None, settings: EngineSettings, *, draft_checked: bool = False
) -> tuple[ResolvedModel | None, EngineSettings]:
    """The draft model to load and the settings, once whoever drafts for `target` was checked: a draft named
    as the draft that is an EAGLE-3 head drafts as the head (EngineSettings.head); a draft model, a head and
    MTP exclude each other; a recurrent or hybrid target takes no head; a draft model must be usable and
    compatible (`draft_checked`: already found so, by the store's automatic choice). InvalidSetting,
    UnusableModel or IncompatibleDraft when it cannot draft."""
    if draft is not None and settings.head is None and is_head(draft.info):
        # a head named as the draft (--draft, a pair, a preset, the store's pick) drafts as a head
        if not draft_checked:
            require_compatible(target.name, target.info, draft.name, draft.info)
        draft, settings = None, replace(settings, head=draft.path)
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
    if draft is not None and not draft_checked:
        require_usable(draft.name, draft.info, "draft", llama_cpp_knows)
        require_compatible(target.name, target.info, draft.name, draft.info)
    return draft, settings


def plan_pair(
    target: ResolvedModel,
    draft: ResolvedModel | None,
    settings: EngineSettings,
    *,
    notice: Callable[[str], None] = lambda text: None,
) -> LoadPlan:
    """The pair checked (require_target, check_drafter), its repack choice, and its fit: the most slots that
    fit at the asked context on this machine now (without the memory check, the first slot count asked; MTP
    layers chosen by default that do not fit beside the target let go, said to `notice`)."""
    require_target(target)
    draft, settings = check_drafter(target, draft, settings)
    repack = decide_repack(settings.repack)
    asked = slot_choices(target, settings)
    if not settings.memory_check:
        fit = Fit(settings.n_ctx, asked[0])
    else:
        devices, notes = backends.discover_devices()
        context = ContextChoice(settings.n_ctx, False, "asked")
        try:
            fit = fit_pair(pair_facts(target, draft, settings, repack.enabled), context, asked, devices, notes)
        except InsufficientMemory as refused:  # MTP layers chosen by default that do not fit are let go
            settings = let_mtp_go(settings, refused, notice)
            fit = fit_pair(pair_facts(target, draft, settings, repack.enabled), context, asked, devices, notes)
    return LoadPlan(target, draft, replace(settings, n_ctx=fit.n_ctx), repack, fit)
