"""The engine's slots, filled in arrival order: a bounded FIFO of generations (and embeddings).

The HTTP handlers live on the asyncio loop; llama.cpp calls block, so generations run in the
engine's step loop (engine/step_loop.py: one thread, every slot's step in the same passes), each in
a slot of its own (its own sequence in both KV caches), and hand their text pieces back through an
asyncio queue each. A request waits only while every slot is busy, and never shares a slot's cache.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

from ollama_spec.decoding.loop import Token
from ollama_spec.engine.engine import Engine, Request, Result
from ollama_spec.engine.step_loop import Ticket
from ollama_spec.errors import OllamaSpecError, Stopped
from ollama_spec.server.serving.mailbox import Mailbox

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


class ModelDeleted(Cancelled):
    """The job was cancelled because its model was deleted: the model is gone, so retrying will not help (a
    404, as a request that comes after the delete gets)."""


SHUTTING_DOWN = "the server is shutting down"


@dataclass(frozen=True)
class Piece:
    text: str
    scored: tuple[Token, ...] = ()  # with logprobs asked for: the tokens since the last piece
    drafted: Marks | None = None  # with show_draft: per character of text, whether the draft wrote it

    def then(self, following: Piece) -> Piece:
        """This piece and the one after it, as one."""
        drafted = None if self.drafted is None or following.drafted is None else self.drafted + following.drafted
        return Piece(self.text + following.text, self.scored + following.scored, drafted)


@dataclass(frozen=True)
class Finished:
    result: Result
    scored: tuple[Token, ...] = ()  # with logprobs: the tokens no piece carried (text held back, then dropped)
    piece: Piece | None = None  # the text that was waiting with the end (Job.events): sent with it, as one


@dataclass(frozen=True)
class Failed:
    error: Exception


Event = Piece | Finished | Failed


class Job:
    """One submitted request: its events arrive in order on the loop that submitted it (through
    `mailbox`, shared by the jobs of that loop)."""

    def __init__(
        self, request: Request, loop: asyncio.AbstractEventLoop, label: str = "", mailbox: Mailbox | None = None
    ):
        self.request, self.label = request, label  # label: the route, for the log and the metrics
        self._mailbox = mailbox if mailbox is not None else Mailbox(loop)
        self._events: asyncio.Queue[Event] = asyncio.Queue()
        self._cancelled = threading.Event()
        self.ticket: Ticket | None = None  # its place in the engine's step loop
        self.reason = SHUTTING_DOWN  # why it was cancelled, for a client still listening
        self.cancelled_as: type[Cancelled] = Cancelled  # the error that client gets
        self._sent = 0  # logprobs: the tokens handed on with a piece so far
        self._told = False  # anything was handed on
        self._at_end: Callable[[], None] | None = None  # run on the loop's thread once its end is taken

    def cancel(self, reason: str | None = None, error: type[Cancelled] = Cancelled) -> None:
        """Stop generating at the next step (or skip the job if it has not started); `reason`: what a
        client still listening is told (the server is stopping, its model is being deleted), as `error`."""
        if reason is not None and not self.cancelled:
            self.reason, self.cancelled_as = reason, error
        self._cancelled.set()
        if self.ticket is not None:
            self.ticket.cancel()

    @property
    def started(self) -> bool:
        """A slot took it: it holds a slot, not a place in the queue."""
        return self.ticket is not None and self.ticket.generation is not None

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def put(self, *events: Event) -> None:
        """Hand on `events`; a stream's first piece and its end at once (see Mailbox)."""
        self._mailbox.put(self, events, urgent=not self._told or not isinstance(events[-1], Piece))
        self._told = True

    def take(self, events: tuple[Event, ...]) -> None:
        """On the loop's thread: `events` for the reader; after its end, what was to run then (`_at_end`),
        once the reader has had its turn: the answer's last chunks are written before the log line."""
        for event in events:
            self._events.put_nowait(event)  # the reader's turn is queued now, when it waits for them
        if self._at_end is not None and not isinstance(events[-1], Piece):
            at_end, self._at_end = self._at_end, None
            self._mailbox.loop.call_soon(at_end)

    async def events(self) -> AsyncIterator[Event]:
        """Pieces of text, then one Finished or Failed. The pieces waiting when the reader comes are
        one piece (a step's tokens, verified together, or more where the reader fell behind): one
        chunk to frame and write, not one a token; with the end, they come as its `piece`."""
        events = self._events
        while True:
            event = await events.get()
            while isinstance(event, Piece) and not events.empty():
                following = events.get_nowait()
                if isinstance(following, Finished):
                    event = replace(following, piece=event)
                elif not isinstance(following, Piece):
                    yield event
                    event = following
                    break
                else:
                    event = event.then(following)
            yield event
            if not isinstance(event, Piece):
                return


# Before any job has finished, the work ahead is guessed at a second a job.
FIRST_GUESS_SECONDS = 1.0


class Worker:
    """Runs jobs in arrival order in the engine's step loop, as many at once as it has slots; at
    most `max_queue` wait for a free slot, generations and embeddings alike. Embeddings (a context
    of their own) run one at a time on a thread beside the loop."""

    def __init__(self, engine: Engine, max_queue: int, on_finished: Callable[[Job, Result], None]):
        self.engine, self.max_queue, self.on_finished = engine, max_queue, on_finished
        self.slots = engine.slots
        self._calls = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ollama-spec-call")
        self._lock = threading.Condition()
        self._jobs: list[Job | object] = []  # running first, then waiting
        self._mean_seconds = FIRST_GUESS_SECONDS  # a job's time, averaged over the recent ones
        self._mailbox: Mailbox | None = None  # the jobs' events, to the loop that submitted them
        # called (on the thread the last job ended on) when no job runs or waits any more
        self.on_idle: Callable[[], None] | None = None

    @property
    def waiting(self) -> int:
        with self._lock:
            return max(len(self._holding()) - self.slots, 0)

    @property
    def busy(self) -> int:
        """Jobs running or waiting: 0 when the engine is idle."""
        with self._lock:
            return len(self._holding())

    def _holding(self) -> list[Job | object]:
        """The entries that hold a slot or a place in the queue: a job cancelled before it started (its
        client left) gives its place back at once, though the loop skips it only at its next turn."""
        return [entry for entry in self._jobs if not isinstance(entry, Job) or entry.started or not entry.cancelled]

    def submit(self, request: Request, label: str = "") -> Job:
        """Queue a generation; QueueFull when max_queue requests are already waiting."""
        loop = asyncio.get_running_loop()
        if self._mailbox is None or self._mailbox.loop is not loop:
            self._mailbox = Mailbox(loop)
        job = Job(request, loop, label, self._mailbox)
        self._enqueue(job)
        try:
            job.ticket = self.engine.submit(request, _Sink(self, job), runs=request.show_draft)
        except BaseException:
            self._done(job)
            raise
        if job.cancelled:  # cancelled (shutdown) while it was being queued
            job.ticket.cancel()
        return job

    async def call(self, work: Callable[[], T]) -> T:
        """Run `work` (an embedding, on a context of its own) after the calls queued before it; QueueFull
        as for a generation."""
        entry = object()
        self._enqueue(entry)
        started = time.monotonic()

        def run() -> T:
            try:
                return work()
            finally:
                self._done(entry, time.monotonic() - started)

        return await asyncio.wrap_future(self._calls.submit(run))

    def _enqueue(self, entry: Job | object) -> None:
        with self._lock:
            if (ahead := len(self._holding())) >= self.slots + self.max_queue:
                raise QueueFull(
                    f"the server is busy: {ahead - self.slots} requests are already waiting "
                    f"(--max-queue {self.max_queue}); retry later",
                    retry_after=max(1, math.ceil(ahead * self._mean_seconds / self.slots)),
                )
            self._jobs.append(entry)

    def _done(self, entry: Job | object, seconds: float | None = None) -> None:
        """The entry leaves the queue; its time (when it ran) joins the average."""
        with self._lock:
            if entry in self._jobs:
                self._jobs.remove(entry)
            if seconds is not None:
                self._mean_seconds = 0.8 * self._mean_seconds + 0.2 * seconds
            self._lock.notify_all()
            idle = not self._holding()
        if idle and self.on_idle is not None:
            self.on_idle()

    def cancel_all(self, reason: str = SHUTTING_DOWN, error: type[Cancelled] = Cancelled) -> None:
        """Stop the running generations and skip the waiting ones (shutdown, a delete of the model);
        `reason`: what their clients are told, as `error`.

        Called from the signal handler, on the main thread, which may be holding the lock (in
        `submit`): so no lock here. Copying the list is atomic, and a job only sets flags."""
        for job in list(self._jobs):
            if isinstance(job, Job):
                job.cancel(reason, error)

    def close(self) -> None:
        """Cancel every job and wait until each has ended (its slot freed at the loop's next step)."""
        self.cancel_all()
        with self._lock:
            while any(isinstance(job, Job) for job in self._jobs):
                self._lock.wait()
        self._calls.shutdown(wait=True)


class _Sink:
    """A job's answer as the step loop hands it over (step_loop.Sink), turned into the job's events."""

    def __init__(self, worker: Worker, job: Job):
        self.worker, self.job = worker, job

    def pieces(self, ticket: Ticket, pieces: list) -> None:
        """A step's pieces as one Piece with the scored tokens they complete: one event for the event loop
        to take, frame and write a step, not one a token."""
        job, upto = self.job, pieces[-1][1]
        if ticket.runs:  # each a Generation.pieces' piece, which says whether the draft wrote it
            text = "".join([piece.text for piece, _ in pieces])
            drafted = tuple([piece.from_draft for piece, _ in pieces for _ in piece.text])
        else:
            text, drafted = pieces[0][0] if len(pieces) == 1 else "".join([piece for piece, _ in pieces]), None
        scored = tuple(ticket.generation.result.scored[job._sent : upto]) if upto > job._sent else ()
        job._sent = upto
        job.put(Piece(text, scored, drafted))

    def end(self, ticket: Ticket) -> None:
        """The job's end. Its count and log line (`on_finished`) are the event loop's, as its end is taken:
        the step loop's thread, which calls this between two passes, does not write the log (a write lets
        go of the GIL, and the event loop's thread, often waiting for it, would take it)."""
        job, result = self.job, ticket.generation.result
        self.worker._done(job, result.total_seconds)
        job._at_end = partial(self.worker.on_finished, job, result)
        if result.finish_reason == "cancelled":
            # A client that left hears nothing; one still listening (the server is stopping) must not
            # take a cut-short answer for a finished one, so it gets an error, not a finish.
            job.put(
                Failed(job.cancelled_as(f"{job.reason}: the answer was cut short after {len(result.tokens)} tokens"))
            )
            return
        job.put(Finished(result, tuple(result.scored[job._sent :])))

    def fail(self, ticket: Ticket, error: Exception) -> None:
        self.worker._done(self.job)
        if (ticket.generation is None and ticket.cancelled) or isinstance(error, Stopped):
            error = self.job.cancelled_as(self.job.reason)  # cancelled before it began, or while a step waited
        elif not isinstance(error, OllamaSpecError):  # the request fails; the server keeps serving
            log.error("generation failed", exc_info=error)
        self.job.put(Failed(error))
