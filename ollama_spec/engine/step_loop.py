"""One loop per loaded pair: the queue of admitted requests, the slot table, the step's K and every pass.

As llama-server's `update_slots`: one thread owns the slots, and each turn of the loop

1. admits waiting requests into free slots (arrival order; the slot by engine/slots.py's rule), and
   again before each later pass those that came meanwhile (a prompt's last piece beside requests that
   generate, all of a short one, is read at once, in a target pass of its own: `prompt_chunks.read_at_once`),
2. runs the draft passes of every drafting slot together, one llama_decode a draft token, until the
   slots drafting beside each other stop together where the next pass no longer pays (engine/batch_k.py),
3. plans one K for every slot's next step, from each slot's acceptance by position and the costs
   of the step's shapes as its passes timed them (engine/batch_k.py, decoding/pass_prices.py: the most
   accepted tokens per second of the step),
4. runs one target pass with every slot's verify rows and the next chunk of each prompt being read,
5. hands each request its verified tokens as text, through its own sink; each slot then starts its
   next step at the K of step 3.

A request is plain state: its Generation's steps (a generator that yields each evaluation it needs:
decoding/evals.py), which the loop runs in the pass of its kind and answers with its rows. No thread
per request and no barrier: what is in a pass is what every slot asked for by then.

The one lock (`_lock`) guards what other threads touch: the queue of waiting tickets and the
tickets' cancel flags. The slot table, the caches and every llama.cpp call are the loop thread's.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from ollama_spec.decoding.evals import Declined, Eval
from ollama_spec.engine.admission import Slot, admit_waiting, model_of
from ollama_spec.engine.batch_k import BatchK, drafting_beside
from ollama_spec.engine.cpu_policy import run_normally
from ollama_spec.engine.prompt_chunks import ChunkSizer, read_at_once
from ollama_spec.engine.requests import Request
from ollama_spec.engine.tickets import Pass, Sink, Ticket

# Python hands the GIL to a thread that waits for it only every switch interval (5 ms by default), and
# each piece the loop hands on wakes its reader's thread (a client, the server's event loop), which
# then waits for the GIL while the loop runs on: on the tiny pair 64 tokens took 120-750 ms through
# the loop against 70 ms run directly, nearly all of it in those waits; at 0.5 ms, 17-32 ms.
SWITCH_INTERVAL_S = 0.0005
# A draft step's passes read at most the last accepted token and the one after it, a row each
DRAFT_STEP_TOKENS = 2


@dataclass
class StepLoop:
    """The loop of one loaded pair (see the module); `engine` is the Engine whose slots it runs."""

    engine: Any
    decodes: int = 0  # llama_decode calls made through the loop (the tests read it)
    passes: list[Pass] | None = None  # when a list: every pass run, as a Pass (bench's ceiling)
    steps: int = 0  # turns that ended in a target pass
    outside_s: float = 0.0  # their seconds outside llama.cpp's passes: the Python of the steps
    _passes_s: float = 0.0
    _mark: float = 0.0  # where the time the next pass is priced by begins (`_pass`)
    _admitted_s: float = 0.0  # this turn's Python before its first pass: the step's, priced with its target pass
    _handed_s: float = 0.0  # this turn's text handed on before its passes (`_send`): the step's, as `_admitted_s`
    _draft_shape: tuple[int, int] = (0, 0)  # the last draft pass's sequences and tokens of the widest
    _lock: threading.Condition = field(default_factory=threading.Condition)
    _waiting: deque[Ticket] = field(default_factory=deque)
    _slots: dict[int, Slot] = field(default_factory=dict)
    _chunks: ChunkSizer = field(default_factory=lambda: ChunkSizer(0))  # its piece: the engine's, at admission
    # the sinks' calls of this turn, made just before the next pass or at the turn's end (`_send`)
    _outbox: list[tuple[Any, tuple]] = field(default_factory=list)
    _k: BatchK = field(init=False)  # the steps' K, priced by the passes this loop times
    _admit_waiting: Callable[[], list[Slot]] = field(init=False)  # waiting tickets into free slots: the slots filled
    _target: Any = field(init=False)
    _thread: threading.Thread | None = None
    _idle: bool = False  # its thread waits for work
    _held: bool = False  # a caller's thread runs the turns (`queue`)
    _closed: bool = False

    def __post_init__(self) -> None:
        self._target = self.engine.target
        self._k = BatchK(self.engine.costs.passes, self._target.min_width)
        start = lambda slot: self._advance(slot, None)  # its steps run up to their first evaluation
        self._admit_waiting = partial(
            admit_waiting, self.engine, self._waiting, self._lock, self._slots, self._chunks, start
        )

    def submit(
        self, request: Request, prompt: list[int], sink: Sink, *, runs: bool = False, use_draft: bool = True
    ) -> Ticket:
        """Queue a request whose prompt is `prompt`; its answer goes to `sink`, called from the loop's thread."""
        self.queue(ticket := Ticket(request, list(prompt), sink, runs, use_draft))
        return ticket

    def queue(self, ticket: Ticket, *, here: bool = False) -> bool:
        """Queue `ticket` (arrival order); True when, with `here`, the calling thread holds the loop (it had
        nothing else to run): it runs the turns (`run_turn`) until `let_go`, the loop's thread asleep."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the step loop is closed")
            self._waiting.append(ticket)
            alone = len(self._waiting) == 1 and not self._slots and (self._thread is None or self._idle)
            if held := here and alone and not self._held:
                self._held = True
            else:
                self._wake()
        return held

    def let_go(self) -> None:
        """The calling thread stops running turns: what was queued meanwhile goes to the loop's thread."""
        with self._lock:
            self._held = False
            if self._waiting or self._slots:
                self._wake()

    def _wake(self) -> None:
        if self._thread is None:
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
            self._thread = threading.Thread(target=self._run, name="ollama-spec-steps", daemon=True)
            self._thread.start()
        self._lock.notify()

    @contextmanager
    def together(self) -> Iterator[None]:
        """Requests submitted in the body are admitted at the same turn (none before the body ends)."""
        with self._lock:
            yield

    @property
    def running(self) -> int:
        return len(self._slots)

    def close(self) -> None:
        """Cancel every request and stop the loop's thread."""
        with self._lock:
            self._closed = True
            for ticket in [*self._waiting, *(slot.ticket for slot in self._slots.values())]:
                ticket.cancel()
            self._lock.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

    def _run(self) -> None:
        run_normally()  # started by a request's thread, which may be the HTTP side's (engine/cpu_policy.py)
        while True:
            with self._lock:
                self._idle = True  # a caller's thread may hold the loop (`queue`) only while this waits
                while self._held or (not self._waiting and not self._slots and not self._closed):
                    self._lock.wait()
                self._idle = False
                if self._closed and not self._slots and not self._waiting:
                    return
            self.run_turn()

    def run_turn(self) -> None:
        """One `turn` (on the thread that runs the loop). Its sinks' calls are made just before the next
        turn's first pass (`_send`); at its end only where no pass follows at once: no slot runs, or a
        caller's thread runs the turns and reads its answer between them (`queue`'s `here`)."""
        try:
            self.turn()
        except Exception as exc:  # noqa: BLE001 - a fault outside any one request: theirs all end, the loop goes on
            for slot in list(self._slots.values()):
                self._fail(slot, exc)
        if self._held or not self._slots:
            self._send()

    def turn(self) -> None:
        """One step for every slot: admit, the draft passes, the next step's K, one target pass (each
        slot then verifies, rolls back, hands on its tokens and starts its next step at that K)."""
        started, self._passes_s = time.perf_counter(), 0.0
        self._admit()
        self._mark = time.perf_counter()
        self._admitted_s, self._handed_s = self._mark - started, 0.0
        target = self._target  # the others draft: a draft model's sequences, or a head's
        if len(self._slots) > 1 and (at_once := read_at_once(self._slots, target)):
            self._pass(at_once, priced=False)
        while True:
            if len(self._slots) == 1:  # alone: nothing to sort out, and no slot to stop drafting beside
                wanting = [*self._slots.values()]
                if wanting[0].ticket.cancelled:
                    wanting = _wanting(wanting, self._finish)
                elif wanting[0].model is not target:
                    if not (self._waiting and self._join()):  # one came: admitted before this draft pass
                        self._pass(wanting)
                    continue
            else:
                wanting = _wanting(list(self._slots.values()), self._finish)
                drafting = [slot for slot in wanting if slot.model is not target]
                if drafting:
                    if self._waiting and self._join():  # came during the draft passes: in the next one
                        continue
                    if not _declined(self._k, drafting, len(wanting), self._advance):
                        self._pass(drafting)
                    continue
            if not wanting:
                return
            if self._waiting and self._join():  # came during the last draft pass: into this target pass
                continue
            self._k.choose([slot.ticket.generation for slot in self._slots.values()])
            self._pass(wanting)
            self.steps += 1
            self.outside_s += time.perf_counter() - started - self._passes_s
            return  # the target's pass ends the step

    def _admit(self) -> None:
        """Waiting requests into the free slots, in arrival order, each starting its first chunk in this
        turn's passes; then the turn's passes begin (`_chunks` times the turns)."""
        if self.engine.slots == 1:  # no other slot's steps for a prompt's chunks to be timed beside
            if self._waiting and not self._slots:
                self._admit_waiting()
            return
        waited = not self._slots  # the loop waits for work only with no slot running
        began = [bool(s.ticket.generation.result.tokens) for s in self._slots.values()]  # past its prompt
        self._chunks.generating = any(began)
        if self._waiting:
            self._admit_waiting()
            began = [bool(s.ticket.generation.result.tokens) for s in self._slots.values()]
        self._chunks.turn(time.perf_counter(), generating=any(began), reading=not all(began), waited=waited)

    def _join(self) -> bool:
        """Before a draft or target pass of the turn: waiting requests into the free slots, so that a
        client's next request, sent while the draft passes ran, does not sit out the step under way with
        its slot empty (`read_at_once`, or its first evaluation in the next passes). True if any came in."""
        if self.engine.slots == 1 or len(self._slots) >= self.engine.slots:
            return False
        fresh = self._admit_waiting()
        if any(not s.ticket.generation.result.tokens for s in self._slots.values()):
            self._chunks.reading()  # this turn's time is not a step's alone
        if fresh and (at_once := read_at_once(self._slots, self._target)):
            self._pass(at_once, priced=False)
        return bool(fresh)

    def _pass(self, slots: list[Slot], *, priced: bool = True) -> None:
        """One decode of the model the slots' evaluations are for, each slot's rows sent on to it."""
        model = slots[0].model
        handed = 0.0
        if self._outbox:  # the readers it wakes run while llama.cpp has let go of the GIL, not against this thread
            handed = time.perf_counter()
            self._send()
            handed = time.perf_counter() - handed
            self._handed_s += handed
        started = time.perf_counter()
        try:
            items = [
                (s.wanted_seq, e.tokens, model.rows_asked(e.tokens, e.logits, s.wanted_seq))
                for s in slots
                for e in (s.wanted,)
            ]
            rows = model.decode_many(items)
        except Exception as exc:  # noqa: BLE001 - every request in the pass fails with it
            for slot in slots:
                self._fail(slot, exc)
            return
        seconds = time.perf_counter() - started
        self.decodes += 1
        self._passes_s += seconds
        draft = model is not self._target  # a draft model's pass, or a head's
        widest = len(items[0][1]) if len(items) == 1 else max([len(tokens) for _, tokens, _ in items])
        reshaped = False  # a draft pass of another shape than the one before it (pass_line.RESHAPED)
        if draft and (shape := (len(items), widest)) != self._draft_shape:
            reshaped, self._draft_shape = True, shape
        if self.passes is not None:
            tokens, n_rows = sum(len(t) for _, t, _ in items), sum(r for _, _, r in items)
            self.passes.append(Pass(int(draft), len(items), tokens, n_rows, widest, seconds))
        running = len(self._slots)
        # a target pass in which a slot reads its prompt (no token yet) beside other sequences: its size,
        # widest x sequences, is a piece's padded shape, not a step's (alone, it is the tokens read)
        reading = not draft and len(slots) > 1 and any(not slot.ticket.generation.result.tokens for slot in slots)
        for slot, slot_rows in zip(slots, rows):
            self._advance(slot, slot_rows)
        now = time.perf_counter()
        seconds, self._mark = now - self._mark - handed, now
        if priced:
            self._price(model, draft, items, widest, seconds, reshaped, ended=len(self._slots) < running or reading)

    def _price(
        self, model: Any, draft: bool, items: list, widest: int, seconds: float, reshaped: bool, *, ended: bool
    ) -> None:
        """Tell the costs and the step's K what a pass took (`_pass`): `seconds` since the pass before it
        (`draft`: the draft's, or a head's); `ended`: a slot ended in it, or one read its prompt beside the
        others."""
        # Priced by what it took since the pass before it: the Python that led up to it, its decode, and
        # its slots reading their rows up to their next evaluations (a draft token sampled and weighed; a
        # step verified and the next one begun); a target pass, the step's Python before its first pass
        # and its text handed on too. K is then chosen on what a step really takes, not its llama.cpp
        # calls alone (on the tiny pair a draft token's Python is about its decode). The text is handed
        # on once a step, before the step's first pass, whichever it is (the readers woken take the GIL,
        # on a busy machine the core too): counted in that pass, a step's first draft column would look
        # dearer than the next by it, and a step at K=0 dearer than a drafting one's target pass.
        # Not priced: a draft's prompt read, a prompt read at once or beside the others' verify rows (not
        # what steps cost: priced as a piece's padded shape, its rows cost less each than a step's; on the
        # demo pair one 63-token piece beside three verify rows of 4 among the target line's 48 passes
        # moved it from 35 ms + 6.7 ms a token to 160 + 2.0, where deep drafts look nearly free), and a
        # pass a request ended in.
        if not draft:
            seconds, self._admitted_s, self._handed_s = seconds + self._admitted_s + self._handed_s, 0.0, 0.0
        if ended or (draft and widest > DRAFT_STEP_TOKENS):
            return
        # a target pass beside others by the tokens it computes, each sequence padded (batch_steps.py)
        size = len(items) if draft else (widest if len(items) == 1 else max(widest, model.min_width)) * len(items)
        self.engine.costs.observe(draft, size, seconds)
        self._k.observe(draft, size, seconds, len(items), reshaped)

    def _advance(self, slot: Slot, rows: np.ndarray | Declined | None) -> None:
        """Run the slot's steps up to its next evaluation, its text handed on; its end, or its failure."""
        ticket, steps, pieces, failed = slot.ticket, slot.steps, None, None
        try:
            item = steps.send(rows) if rows is not None else next(steps)
            if not isinstance(item, Eval):  # text: most passes have none (a draft token, a prompt's chunk)
                pieces, scored = [], ticket.generation.result.scored
                while not isinstance(item, Eval) and not ticket.cancelled:
                    pieces.append((item, len(scored)))  # its tokens' logprobs: up to there
                    item = next(steps)
            slot.wanted = item
            if isinstance(item, Eval) and item.model is not slot.view:  # a slot's views stay: worked out once each
                slot.view = item.model
                slot.model, slot.wanted_seq = model_of(item)
        except StopIteration:
            slot.wanted = None
        except Exception as exc:  # noqa: BLE001 - the request fails; the others go on
            failed = exc
        if pieces:  # handed on with the turn's other sinks' calls (`_send`)
            self._outbox.append((ticket.sink.pieces, (ticket, pieces)))
        if failed is not None:
            self._fail(slot, failed)
            return
        if slot.wanted is None or ticket.cancelled:
            self._finish(slot)

    def _send(self) -> None:
        """Make the sinks' calls of this turn, in order. Each may wake a reader's thread, which then
        wants the GIL: made just before a pass, whose llama_decode lets go of the GIL, the reader runs
        during it; made while this thread runs Python, the two take turns at the GIL (on the tiny pair
        a quarter of the loop thread's time went waiting for it to come back)."""
        if self._outbox:
            outbox, self._outbox = self._outbox, []
            for call, args in outbox:
                call(*args)

    def _finish(self, slot: Slot) -> None:
        self._release(slot)
        result = slot.ticket.generation.result
        if slot.ticket.cancelled:
            result.finish_reason = "cancelled"
        self._outbox.append((slot.ticket.sink.end, (slot.ticket,)))

    def _fail(self, slot: Slot, error: Exception) -> None:
        self._release(slot)
        self._outbox.append((slot.ticket.sink.fail, (slot.ticket, error)))

    def _release(self, slot: Slot) -> None:
        slot.wanted = None
        slot.steps.close()  # the generation's own ending: statistics kept, costs learned
        if self._slots.get(slot.seq) is slot:
            del self._slots[slot.seq]
            self.engine.pool.release(slot.seq)


def _declined(k: BatchK, drafting: list[Slot], rows: int, advance: Callable[[Slot, Declined], None]) -> bool:
    """Before a draft pass: do the slots drafting beside each other stop here (engine/batch_k.py, over
    the `rows` sequences of the coming target pass)? Then each is told so (`Declined`, through `advance`)."""
    if not k.weighs:  # they draft the K planned
        return False
    members = [slot for slot in drafting if drafting_beside(slot.ticket.generation.policy)]
    policies = [slot.ticket.generation.policy for slot in members]
    width = k.stop(policies, rows, len(drafting)) if members else None
    if width is None:
        return False
    for slot in members:
        advance(slot, Declined(width))
    return True


def _wanting(slots: list[Slot], finish: Callable[[Slot], None]) -> list[Slot]:
    """The slots that want a pass, the cancelled ones finished (`finish`)."""
    for slot in [slot for slot in slots if slot.ticket.cancelled]:
        finish(slot)
    return [slot for slot in slots if slot.wanted is not None]
