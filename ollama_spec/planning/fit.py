"""Whether a pair fits, decided once: the context and slots it loads with on the memory left beside what is
taken, or the plan's words for why it does not fit.

The CLI's engine, the pinned server and the store's scheduler all ask `fit_pair`; the engine loads with
the fit it is given and never plans again, and the scheduler keeps only the bookkeeping of what its
loaded pairs take (`less_taken`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from ollama_spec.models.gguf_info import ModelInfo
from ollama_spec.planning.context import ContextChoice, lower_context
from ollama_spec.planning.devices import Device
from ollama_spec.planning.memory import MemoryPlan, ensure_fits, plan_memory


@dataclass(frozen=True)
class PairFacts:
    """What the memory plan reads of a pair and of how it loads, besides its context and slots."""

    target: ModelInfo
    draft: ModelInfo | None
    kv_type: str = "f16"
    repack: bool = True  # llama.cpp's repacked CPU weights (canary.decide_repack)
    features: frozenset[str] = frozenset()  # the CPU's, as llama.cpp reports them
    flash_attention: bool | None = None  # None: what llama.cpp's "auto" does
    tensor_split: tuple[float, ...] = ()
    remote: tuple[Device, ...] = ()  # RPC servers' devices
    main_device: int | None = None
    mtp: bool = False  # the target's MTP (NextN) layers draft for it

    def plan(self, n_ctx: int, slots: int, devices: Sequence[Device], notes: Sequence[str] = ()) -> MemoryPlan:
        """The memory plan for `slots` sequences of `n_ctx` tokens each on `devices`."""
        return plan_memory(
            self.target,
            self.draft,
            n_ctx,
            self.kv_type,
            devices,
            notes=notes,
            repack=self.repack,
            features=self.features,
            flash_attention=self.flash_attention,
            tensor_split=self.tensor_split,
            remote=self.remote,
            main_device=self.main_device,
            n_seq=slots,
            mtp=self.mtp,
        )


@dataclass(frozen=True)
class Fit:
    """What a pair loads with: its context, its slots, and the plan that says where it goes (None: loaded
    without the memory check). `lowered_from`: the context chosen before it was lowered to fit."""

    n_ctx: int
    slots: int
    plan: MemoryPlan | None = None
    lowered_from: int | None = None


def fit_pair(
    facts: PairFacts,
    context: ContextChoice,
    slot_counts: Sequence[int],
    devices: Sequence[Device],
    notes: Sequence[str] = (),
    taken: tuple[int, int] = (0, 0),
) -> Fit:
    """The first fit, most slots first at the chosen context, then (a context chosen automatically only)
    a tier lower at a time, on `devices` less `taken` (bytes on GPUs, bytes in RAM) that other loaded pairs
    hold. InsufficientMemory, in the plan's words, when nothing fits."""
    left = less_taken(devices, *taken)
    n_ctx: int | None = context.n_ctx
    plan = None
    while n_ctx is not None:
        for slots in slot_counts:
            plan = facts.plan(n_ctx, slots, left, notes)
            if plan.fits:
                lowered = context.n_ctx if n_ctx != context.n_ctx else None
                return Fit(n_ctx, slots, plan, lowered)
        n_ctx = lower_context(n_ctx) if context.auto else None
    assert plan is not None, "no slot count to try"
    ensure_fits(plan)
    raise AssertionError("ensure_fits raised for a plan that does not fit")


def less_taken(devices: Sequence[Device], gpu: int, host: int) -> list[Device]:
    """`devices` less what loaded pairs hold: `gpu` bytes from the GPUs in order, `host` bytes from RAM."""
    left = []
    for device in devices:
        taken = host if not device.is_gpu else min(gpu, device.free)
        if device.is_gpu:
            gpu -= taken
        left.append(replace(device, free=max(device.free - taken, 0)))
    return left
