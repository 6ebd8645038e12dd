"""The store as `serve` without a TARGET serves it: which models can run, and for a requested name the
pair to load (its draft, and why), its context (Ollama's rule, lowered until the pair fits) and its
request defaults."""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ollama_spec.engine.load_plan import (
    EngineSettings,
    LoadPlan,
    check_drafter,
    pair_facts,
    require_target,
    slot_choices,
)
from ollama_spec.engine.mtp_default import let_mtp_go
from ollama_spec.engine.pairing import ALONE, DraftChoice, choose_draft
from ollama_spec.errors import InsufficientMemory, OllamaSpecError
from ollama_spec.llama.backends import llama_cpp_knows
from ollama_spec.llama.canary import RepackDecision, decide_repack
from ollama_spec.models.modelfile import Modelfile
from ollama_spec.models.presets import lay_preset
from ollama_spec.models.resolve import ResolvedModel, resolve_model, resolve_stored
from ollama_spec.models.store import Store, StoredModel, find_store_root
from ollama_spec.models.usable import usability_problems
from ollama_spec.planning.context import choose_context
from ollama_spec.planning.devices import Device
from ollama_spec.planning.fit import Fit, fit_pair
from ollama_spec.planning.memory import MemoryPlan
from ollama_spec.server.serving.defaults import RequestDefaults
from ollama_spec.server.serving.settings import ServerSettings

log = logging.getLogger("ollama_spec.server")


@dataclass(frozen=True)
class PairPlan:
    """What to load for one name, decided once: the target (a preset laid over it), its draft and why (both
    checked: check_drafter), the engine's settings (the context chosen, the slots that fit), the repack
    choice and the requests' defaults."""

    name: str
    target: ResolvedModel
    draft: ResolvedModel | None
    draft_why: str
    settings: ServerSettings
    engine: EngineSettings
    ctx_why: str = ""
    plan: MemoryPlan | None = None
    repack: RepackDecision | None = None  # None: decided where the pair is fitted

    @property
    def fit(self) -> Fit:
        """What the engine loads with, as decided here: it does not plan again."""
        return Fit(self.engine.n_ctx, self.engine.parallel or 1, self.plan)

    @property
    def load(self) -> LoadPlan:
        """The plan Engine.load loads, deciding nothing again."""
        repack = self.repack or decide_repack(self.engine.repack)
        return LoadPlan(self.target, self.draft, self.engine, repack, self.fit)


@dataclass
class StorePairs:
    """The store's models and how each is served. `pairs`: --pair TARGET=DRAFT (DRAFT may be "ngram");
    `presets`: -f presets by the name of the model they are FROM; `defaults`: the command's flags, laid
    over each model's params for its requests, in `settings` (the server's); `engine`: the loading flags,
    `ctx` --ctx."""

    models_dir: str | None = None
    pairs: Mapping[str, str] = field(default_factory=dict)
    presets: Mapping[str, Modelfile] = field(default_factory=dict)
    no_draft: bool = False
    engine: EngineSettings = field(default_factory=lambda: EngineSettings(parallel=None))
    ctx: int | None = None
    settings: ServerSettings = field(default_factory=ServerSettings)
    defaults: RequestDefaults = field(default_factory=RequestDefaults)
    _cache: dict = field(default_factory=dict, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)

    def __post_init__(self) -> None:
        # names as the store spells them, so `TINY-TARGET` and `tiny-target:latest` find the same entry
        self.pairs = {self.canonical(target): draft for target, draft in self.pairs.items()}
        self.presets = {self.canonical(target): preset for target, preset in self.presets.items()}

    def store(self) -> Store:
        return Store(find_store_root(self.models_dir))

    def canonical(self, name: str) -> str:
        """The stored name for `name` (ModelNotFound when the store has none)."""
        return self.store().resolve(name).name

    def identify(self, name: str) -> StoredModel:
        """The stored model for `name`, its manifest read once (ModelNotFound when the store has none): its
        stored name, and its `digest`, Ollama's: a copy or a pull over the name gives another, and the model is
        loaded again. `plan` takes it as it is: the name is not looked up again."""
        return self.store().resolve(name)

    def changed(self) -> None:
        """The store was written: read the models again."""
        with self._lock:
            self._cache.clear()

    def runnable(self) -> list[ResolvedModel]:
        """Every model in the store that can run as a target here (a broken manifest, a cloud model, a file
        llama.cpp cannot load are left out), headers read once per manifest version; newest first, the
        order Ollama lists them in (/api/tags, /v1/models)."""
        found = []
        store = self.store()
        for stored in store.models():
            if not isinstance(stored, StoredModel) or stored.config.get("remote_host"):
                continue
            model = self._resolved(stored)
            if model is not None:
                found.append(model)
        return sorted(found, key=_modified, reverse=True)

    def can_run(self, name: str | StoredModel) -> bool:
        """Whether `name` (or the model `identify` read) is a model of the store that runnable() lists (False:
        not in the store, a cloud model, one llama.cpp cannot load here)."""
        try:
            stored = self.store().resolve(name) if isinstance(name, str) else name
        except OllamaSpecError:
            return False
        if not isinstance(stored, StoredModel) or stored.config.get("remote_host"):
            return False
        return self._resolved(stored) is not None

    def _resolved(self, stored: StoredModel) -> ResolvedModel | None:
        try:
            key = (str(stored.manifest_path), stored.manifest_path.stat().st_mtime_ns)
        except OSError:
            return None
        with self._lock:
            if key in self._cache:
                return self._cache[key]
        try:
            model = resolve_stored(stored)  # found already: not looked up again
            model = None if usability_problems(model.info, llama_cpp_knows) else model
        except OllamaSpecError:
            model = None
        with self._lock:
            self._cache[key] = model
        return model

    def plan(
        self,
        name: str | StoredModel,
        devices: Sequence[Device],
        notes: Sequence[str] = (),
        n_ctx: int | None = None,
        ctx_why: str = "a request's num_ctx",
    ) -> PairPlan:
        """The pair to load for `name` (a stored name, or the model `identify` read): `decide`, then `fit`."""
        return self.fit(self.decide(name), devices, notes, n_ctx, ctx_why)

    def decide(self, name: str | StoredModel) -> PairPlan:
        """What to load for `name` (a stored name, or the model `identify` read), checked once: the target with
        its preset, the draft and why, the requests' defaults, the repack choice; its context not chosen yet
        (`fit`). UnusableModel, IncompatibleDraft or InvalidSetting when it cannot run."""
        store = self.store()
        target = resolve_stored(store.resolve(name) if isinstance(name, str) else name)
        preset = self.presets.get(target.name)
        if preset is not None:
            target = lay_preset(target, preset, log.info)
        require_target(target)
        choice = self._draft(store, target, preset)
        engine = choice.engine_settings(self.engine)  # with the target's MTP layers where they draft
        draft, engine = check_drafter(target, choice.model, engine, draft_checked=choice.checked)
        settings = self.defaults.over(target.params, self.settings, choice.source)
        return PairPlan(target.name, target, draft, choice.why, settings, engine, repack=decide_repack(engine.repack))

    def fit(
        self,
        pair: PairPlan,
        devices: Sequence[Device],
        notes: Sequence[str] = (),
        n_ctx: int | None = None,
        ctx_why: str = "a request's num_ctx",
    ) -> PairPlan:
        """The decided `pair` with its context chosen for `devices` (the whole machine, or the scheduler's
        budget): `n_ctx` (chosen by `ctx_why`) over the model's own and --ctx (capped at the trained length);
        InsufficientMemory when it does not fit. A reload for a larger context fits the same decisions again."""
        return fit_context(
            pair,
            given=n_ctx or _num_ctx(pair.target),
            flag=None if n_ctx else self.ctx,
            devices=devices,
            notes=notes,
            given_why=ctx_why if n_ctx else "the model's num_ctx parameter",
        )

    def describe(self, name: str | StoredModel) -> tuple[ResolvedModel, str | None, str]:
        """What /api/show says of a model (a name, or the model `identify` read) without loading it: the target
        (its preset laid over it), its draft's name (or "ngram", or None) and why."""
        store = self.store()
        target = resolve_model(name, store=store) if isinstance(name, str) else resolve_stored(name)
        preset = self.presets.get(target.name)
        if preset is not None:
            target = lay_preset(target, preset, log.info)
        choice = self._draft(store, target, preset)
        return target, choice.model.name if choice.model else choice.source, choice.why

    def _draft(self, store: Store, target: ResolvedModel, preset: Modelfile | None) -> DraftChoice:
        """The draft, in the order --no-draft, --pair, the preset, then as engine/pairing chooses for every
        face: the manifest's draft layer, the target's own MTP layers, the store's best compatible draft, the
        target alone."""
        if self.no_draft:
            return DraftChoice(None, None, ALONE, "--no-draft")
        chosen = self.pairs.get(target.name)
        how = f"--pair {target.name}={chosen}"
        if chosen is None and preset is not None and preset.draft:
            chosen, how = preset.draft, f"the preset {preset.path}"
        return choose_draft(target, chosen, store, said=how, auto_by_default=True)


def _modified(model: ResolvedModel) -> float:
    """When the model's manifest was written, as Ollama's modified_at says (0: not known)."""
    return model.listing.modified if model.listing else 0.0


def _num_ctx(model: ResolvedModel) -> int | None:
    value = model.params.get("num_ctx")
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def fit_context(
    pair: PairPlan,
    given: int | None,
    devices: Sequence[Device],
    notes: Sequence[str] = (),
    flag: int | None = None,
    given_why: str = "asked for",
) -> PairPlan:
    """`pair` with its context (Ollama's rule: planning/context.py) and slots chosen by the one fit
    (planning/fit.py): the most slots that fit, and an automatic context lowered a tier at a time (with
    a log line) until the pair fits. Without the memory check, the context as
    chosen and the slots asked for. InsufficientMemory, in the plan's words, when nothing fits."""
    trained = pair.target.info.context_length or None
    choice = choose_context(given, trained, devices, flag=flag, given_why=given_why)
    settings, slot_counts = pair.engine, slot_choices(pair.target, pair.engine)
    if not settings.memory_check:
        fit = Fit(choice.n_ctx, slot_counts[0])
    else:
        repack = pair.repack.enabled if pair.repack else None
        try:
            fit = fit_pair(pair_facts(pair.target, pair.draft, settings, repack), choice, slot_counts, devices, notes)
        except InsufficientMemory as refused:  # MTP layers chosen by default that do not fit are let go
            settings = let_mtp_go(settings, refused, lambda text: log.info("%s: %s", pair.name, text))
            fit = fit_pair(pair_facts(pair.target, pair.draft, settings, repack), choice, slot_counts, devices, notes)
    if fit.lowered_from is not None:
        log.info(
            "%s: context lowered from %d to %d tokens: the pair would not fit at %d",
            pair.name,
            fit.lowered_from,
            fit.n_ctx,
            fit.lowered_from,
        )
    engine = replace(settings, n_ctx=fit.n_ctx, parallel=fit.slots)
    return replace(pair, engine=engine, ctx_why=choice.why, plan=fit.plan)
