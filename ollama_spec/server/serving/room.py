"""Room for a pair beside the pairs in memory (serving/resident.py): whether it fits on what they leave of the
machine, and making room for it as Ollama's scheduler does: the idle pairs unloaded, least recently used
first, and, while the rest are busy, a wait for one of them to become idle or to close (never a guess)."""

from __future__ import annotations

import time
from dataclasses import dataclass, replace

from ollama_spec.engine.load_plan import pair_facts
from ollama_spec.errors import Busy, InsufficientMemory
from ollama_spec.models.gguf_info import format_bytes
from ollama_spec.planning.context import ContextChoice
from ollama_spec.planning.devices import Device
from ollama_spec.planning.fit import fit_pair
from ollama_spec.server.serving.keep_alive import DEFAULT_KEEP_ALIVE
from ollama_spec.server.serving.pairs import PairPlan
from ollama_spec.server.serving.resident import Resident

MODELS_PER_GPU = 3  # Ollama's defaultModelsPerGPU, when OLLAMA_MAX_LOADED_MODELS is unset
RETRY_AFTER_BUSY = 5  # seconds a client is told to wait when no loaded model became idle in time


@dataclass(frozen=True)
class SchedulerSettings:
    keep_alive: float = DEFAULT_KEEP_ALIVE  # OLLAMA_KEEP_ALIVE, for requests that give none
    max_loaded: int = 0  # OLLAMA_MAX_LOADED_MODELS; 0: 3 per GPU (3 on a CPU)
    memory_budget: int | None = None  # bytes each device may hold for the models (tests; a shared GPU)
    load_timeout: float = 300.0  # how long a load waits for busy models to make room (OLLAMA_LOAD_TIMEOUT)


class Room:
    """The machine as the scheduler counts it (its devices as first seen, capped at the memory budget), and
    the room the pairs in `resident` leave on it."""

    def __init__(self, settings: SchedulerSettings, resident: Resident):
        self.settings, self.resident = settings, resident
        self._devices: tuple[list[Device], list[str]] | None = None

    def machine(self) -> tuple[list[Device], list[str]]:
        """This machine's devices as first seen (before any load), each capped at the memory budget."""
        if self._devices is None:
            from ollama_spec.llama import backends

            devices, notes = backends.discover_devices()
            if (budget := self.settings.memory_budget) is not None:
                devices = [replace(d, total=min(d.total, budget), free=min(d.free, budget)) for d in devices]
                notes = [*notes, f"memory budget: {format_bytes(budget)} a device"]
            self._devices = (devices, notes)
        return self._devices

    def max_loaded(self) -> int:
        if self.settings.max_loaded > 0:
            return self.settings.max_loaded
        gpus = [d for d in self.machine()[0] if d.is_gpu]
        return MODELS_PER_GPU * max(len(gpus), 1)

    def fitted(self, pair: PairPlan) -> PairPlan | None:
        """`pair` with its fit on the memory the pairs in memory leave (its context and slots as planned for
        the whole machine), or None while it does not fit beside them."""
        taking = self.resident.taking()
        if len(taking) >= self.max_loaded():
            return None
        if pair.plan is None or not taking:
            return pair
        devices, notes = self.machine()
        taken = (sum(s.memory[0] for s in taking), sum(s.memory[1] for s in taking))
        fixed = ContextChoice(pair.engine.n_ctx, False, pair.ctx_why)
        facts = pair_facts(pair.target, pair.draft, pair.engine, pair.repack.enabled if pair.repack else None)
        try:
            fit = fit_pair(facts, fixed, [pair.fit.slots], devices, notes, taken)
        except InsufficientMemory:
            return None
        return replace(pair, plan=fit.plan)

    async def make(self, pair: PairPlan) -> PairPlan:
        """Unload idle pairs, least recently used first, until `pair` fits beside the rest; while none is
        idle, wait for a change (a pair idle, one closed) up to load_timeout, then Busy. Under the lock. The
        pair with its fit beside what stays loaded: what the engine loads with."""
        resident = self.resident
        deadline = time.monotonic() + self.settings.load_timeout
        while True:
            await resident.close_retired()
            if (fitted := self.fitted(pair)) is not None:
                return fitted
            idle = [s for s in resident.loaded.values() if s.idle and not resident.wanted[s.name]]
            if idle:
                await resident.unload(min(idle, key=lambda s: s.last_used), f"to make room for {pair.name}")
                continue
            if (left := deadline - time.monotonic()) <= 0:
                raise Busy(f"{pair.name} cannot load: the loaded models stayed busy; retry later", RETRY_AFTER_BUSY)
            await resident.changed.wait(left)
