"""The engine's slots, filled in arrival order: a bounded FIFO of generations (and embeddings).

The HTTP handlers live on the asyncio loop; llama.cpp calls block, so each generation runs on a
thread of its own, in a slot of its own (its own sequence in both KV caches), and hands its text
pieces back through an asyncio queue. The slots' evaluations run as one batch (Engine.run_in_slot);
a request waits only while every slot is busy, and never shares a slot's cache with another.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

from ollama_spec.decoding.loop import Token
from ollama_spec.engine.engine import Engine, Request, Result
from ollama_spec.errors import OllamaSpecError, Stopped

log = logging.getLogger("ollama_spec.server")
T = TypeVar("T")
Marks = tuple[bool, ...]  # per character of a text: True where an accepted draft token wrote it


class QueueFull(OllamaSpecError):
    """More requests are waiting than --max-queue allows; `retry_after`: seconds until the work ahead
    is likely done (HTTP's Retry-After)."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class Cancelled(OllamaSpecError):
    """The job was cancelled (its client left, or the server is stopping) before it started or before
    its generation ended."""


SHUTTING_DOWN = "the server is shutting down"


@dataclass(frozen=True)
class Piece:
    text: str
    scored: tuple[Token, ...] = ()  # with logprobs asked for: the tokens since the last piece
    drafted: Marks | None = None  # with show_draft: per character of text, whether the draft wrote it


@dataclass(frozen=True)
class Finished:
    result: Result
    scored: tuple[Token, ...] = ()  # with logprobs: the tokens no piece carried (text held back, then dropped)


@dataclass(frozen=True)
class Failed:
    error: Exception


Event = Piece | Finished | Failed


class Job:
    """One submitted request: its events arrive in order on the loop that submitted it."""

    def __init__(self, request: Request, loop: asyncio.AbstractEventLoop, label: str = ""):
        self.request, self.label = request, label  # label: the route, for the log and the metrics
        self._loop = loop
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()
        self.started = False  # a slot took it: it holds a slot, not a place in the queue
        self.reason = SHUTTING_DOWN  # why it was cancelled, for a client still listening

    def cancel(self, reason: str | None = None) -> None:
        """Stop generating at the next token (or skip the job if it has not started); `reason`: what a
        client still listening is told (the server is stopping, its model is being deleted)."""
        if reason is not None and not self.cancelled:
            self.reason = reason
        self._cancelled.set()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def put(self, event: Event) -> None:
        try:
            self._loop.call_soon_threadsafe(self._events.put_nowait, event)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancel()

    async def events(self) -> AsyncIterator[Event]:
        """Pieces of text, then one Finished or Failed."""
        while True:
            event = await self._events.get()
            yield event
            if not isinstance(event, Piece):
                return


class _Call:
    """Other work on the engine (an embedding): it waits in the same queue as generations."""

    started = False
    cancelled = False

    def cancel(self, reason: str | None = None) -> None:
        pass


# Before any job has finished, the work ahead is guessed at a second a job.
FIRST_GUESS_SECONDS = 1.0


class Worker:
    """Runs jobs in arrival order, as many at once as the engine has slots (each on a thread of its
    own, their evaluations batched: see Engine.run_in_slot); at most `max_queue` wait for a free
    slot, generations and embeddings alike."""

    def __init__(self, engine: Engine, max_queue: int, on_finished: Callable[[Job, Result], None]):
        self.engine, self.max_queue, self.on_finished = engine, max_queue, on_finished
        self.slots = engine.slots
        self._executor = ThreadPoolExecutor(max_workers=self.slots, thread_name_prefix="ollama-spec-slot")
        self._lock = threading.Lock()
        self._jobs: list[Job | _Call] = []  # running first, then waiting
        self._mean_seconds = FIRST_GUESS_SECONDS  # a job's time, averaged over the recent ones

    @property
    def waiting(self) -> int:
        with self._lock:
            return max(len(self._holding()) - self.slots, 0)

    @property
    def busy(self) -> int:
        """Jobs running or waiting: 0 when the engine is idle."""
        with self._lock:
            return len(self._holding())

    def _holding(self) -> list[Job | _Call]:
        """The entries that hold a slot or a place in the queue: a job cancelled before it started (its
        client left) gives its place back at once, though its entry waits for a slot to be skipped."""
        return [entry for entry in self._jobs if entry.started or not entry.cancelled]

    def submit(self, request: Request, label: str = "") -> Job:
        """Queue a generation; QueueFull when max_queue requests are already waiting."""
        job = Job(request, asyncio.get_running_loop(), label)
        self._enqueue(job)
        self._executor.submit(self._timed, self._run, job)
        return job

    async def call(self, work: Callable[[], T]) -> T:
        """Run `work` (an embedding, on a context of its own) in a slot's thread, after the jobs queued
        before it; QueueFull as for a generation."""
        entry = _Call()
        self._enqueue(entry)
        return await asyncio.wrap_future(self._executor.submit(self._timed, lambda _: work(), entry))

    def _enqueue(self, entry: Job | _Call) -> None:
        with self._lock:
            if (ahead := len(self._holding())) >= self.slots + self.max_queue:
                raise QueueFull(
                    f"the server is busy: {ahead - self.slots} requests are already waiting "
                    f"(--max-queue {self.max_queue}); retry later",
                    retry_after=max(1, math.ceil(ahead * self._mean_seconds / self.slots)),
                )
            self._jobs.append(entry)

    def _timed(self, run: Callable[[Job | _Call], T], entry: Job | _Call) -> T:
        """Run one queued entry; it leaves the queue when done, and its time joins the average."""
        started = time.monotonic()
        with self._lock:
            entry.started = True
        try:
            return run(entry)
        finally:
            with self._lock:
                self._jobs.remove(entry)
                self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * (time.monotonic() - started)

    def cancel_all(self, reason: str = SHUTTING_DOWN) -> None:
        """Stop the running generations and skip the waiting ones (shutdown, a delete of the model);
        `reason`: what their clients are told.

        Called from the signal handler, on the main thread, which may be holding the lock (in
        `submit`): so no lock here. Copying the list is atomic, and a job only sets an event."""
        for job in list(self._jobs):
            job.cancel(reason)

    def close(self) -> None:
        self.cancel_all()
        self._executor.shutdown(wait=True)

    def _run(self, job: Job) -> None:
        try:
            if job.cancelled:
                job.put(Failed(Cancelled(job.reason)))
                return
            prompt = job.request.tokens or self.engine.prompt_tokens(job.request)
            with self.engine.run_in_slot(prompt) as slot:
                generation = self.engine.generate(job.request, slot=slot, stop=lambda: job.cancelled)
                scored = generation.result.scored
                sent = 0
                show_draft = job.request.show_draft
                pieces = generation.pieces() if show_draft else iter(generation)
                try:
                    for piece in pieces:
                        if job.cancelled:
                            generation.result.finish_reason = "cancelled"
                            break
                        text, drafted = (
                            (piece.text, (piece.from_draft,) * len(piece.text)) if show_draft else (piece, None)
                        )
                        job.put(Piece(text, tuple(scored[sent:]), drafted))
                        sent = len(scored)
                finally:
                    pieces.close()
            self.on_finished(job, generation.result)
            if generation.result.finish_reason == "cancelled":
                # A client that left hears nothing; one still listening (the server is stopping) must
                # not take a cut-short answer for a finished one, so it gets an error, not a finish.
                cut = len(generation.result.tokens)
                job.put(Failed(Cancelled(f"{job.reason}: the answer was cut short after {cut} tokens")))
                return
            job.put(Finished(generation.result, tuple(scored[sent:])))
        except Exception as exc:  # the request fails; the server keeps serving
            if isinstance(exc, Stopped):  # cancelled while a step waited: what a client still listening hears
                exc = Cancelled(job.reason)
            if not isinstance(exc, OllamaSpecError):
                log.exception("generation failed")
            job.put(Failed(exc))
