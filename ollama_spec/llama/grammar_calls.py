"""A generation's grammar work, off its own thread and bounded in time.

llama.cpp's grammar sampler is one C call per check, and no C call can be interrupted. Some grammars
make one check take minutes: 1,500 optional items ("a"? "a"? ...) give every prefix of the answer a
parse stack of its own, and each token is advanced through all of them, deduplicated pairwise. So a
generation's grammar calls run in order on a thread of their own (`GrammarCalls`), and the generation
waits for each one: it gives up when its request is cancelled (its client left, its model is being
deleted, the server is stopping), or when one call runs past GRAMMAR_CALL_SECONDS. A call given up on
runs to its end on its thread, which then frees its samplers and ends; meanwhile it holds only its own
copy of the vocabulary (`grammar_vocab`), never the model, which is unloaded as if nothing ran.
"""

from __future__ import annotations

import queue
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, TypeVar

import llama_cpp
from llama_cpp._internals import LlamaModel

from ollama_spec.errors import InvalidSetting, ModelLoadError, Stopped
from ollama_spec.llama.load_params import kv_override_array
from ollama_spec.llama.log import is_verbose, last_error, log_mark

# Far above what real grammars take for one check (milliseconds over a 150k vocabulary), far below what
# a client waits for a token.
GRAMMAR_CALL_SECONDS = 10.0
POLL_SECONDS = 0.02  # how often a waiting generation looks whether its request was cancelled
T = TypeVar("T")


class GrammarTooSlow(InvalidSetting):
    """One check of the output grammar ran past GRAMMAR_CALL_SECONDS: the grammar is too costly to follow."""


class _Call:
    def __init__(self, work: Callable[[], Any]):
        self.work, self.done = work, threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None


class GrammarCalls:
    """One generation's grammar calls, in order, on a daemon thread started at the first call; `stop`
    says when the generation's request was cancelled."""

    def __init__(self, stop: Callable[[], bool] | None = None):
        self._stop = stop or (lambda: False)
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.RLock()  # reentrant: a grammar freed by the collector inside it calls `later`
        self._ended = False  # no more calls: the thread finishes when its queue is empty
        self._finished = False
        self.given_up = False  # a call ran on after its caller stopped waiting: later calls fail at once

    def call(self, work: Callable[[], T]) -> T:
        """`work()` on the thread; Stopped when the request is cancelled meanwhile, GrammarTooSlow when
        it runs past the bound (either way it runs on, and every later call fails at once)."""
        if self.given_up:
            raise Stopped("the output grammar's last check was given up on")
        call = _Call(work)
        self._put(call)
        deadline = time.monotonic() + GRAMMAR_CALL_SECONDS
        while not call.done.wait(POLL_SECONDS):
            if self._stop():
                self.given_up = True
                raise Stopped("the request was cancelled while its output grammar was checked")
            if time.monotonic() > deadline:
                self.given_up = True
                raise GrammarTooSlow(
                    f"the output grammar took more than {GRAMMAR_CALL_SECONDS:g} s to check one token: it is too "
                    "costly to follow (many optional or repeated items that can match the same text); simplify it"
                )
        if call.error is not None:
            raise call.error
        return call.value

    def later(self, work: Callable[[], Any]) -> None:
        """`work()` after the calls queued before it (freeing a sampler a call may still be using), never
        waited for; at once when the thread has finished or never started."""
        with self._lock:
            if self._thread is not None and not self._finished:
                self._queue.put(_Call(work))
                return
        work()

    def end(self) -> None:
        """No more calls: the thread finishes once the queued ones (and any `later` work) have run."""
        with self._lock:
            if self._thread is not None and not self._ended:
                self._ended = True
                self._queue.put(None)

    def _put(self, call: _Call) -> None:
        with self._lock:
            if self._ended:
                raise Stopped("the output grammar's calls have ended")
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="ollama-spec-grammar", daemon=True)
                self._thread.start()
            self._queue.put(call)

    def _serve(self) -> None:
        while True:
            call = self._queue.get()
            if call is None:  # ended: finished once nothing more is queued (`later` may still queue)
                with self._lock:
                    if self._queue.empty():
                        self._finished = True
                        return
                self._queue.put(None)
                continue
            try:
                call.value = call.work()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller, on its thread
                call.error = exc
            call.done.set()


class GrammarVocab:
    """A model's vocabulary alone (llama.cpp's vocab_only load of the same file, with the same metadata
    overrides): what a grammar sampler reads, kept alive by each grammar that uses it."""

    def __init__(self, path: str, kv_overrides: tuple = ()):
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        overrides = kv_override_array(kv_overrides)
        if overrides is not None:
            params.kv_overrides = overrides
        mark = log_mark()
        try:
            self._model = LlamaModel(path_model=path, params=params, verbose=is_verbose())
        except ValueError as exc:
            raise ModelLoadError(
                f"llama.cpp could not read the vocabulary of {path}: {last_error(mark) or exc}"
            ) from None
        self.vocab = self._model.vocab

    def __del__(self) -> None:
        model = getattr(self, "_model", None)
        if model is not None:
            model.close()


_VOCABS: weakref.WeakKeyDictionary[Any, GrammarVocab] = weakref.WeakKeyDictionary()
_VOCABS_LOCK = threading.Lock()


def grammar_vocab(model: Any) -> GrammarVocab:
    """The vocabulary grammars over `model` (a llama/model.LoadedModel) use, read once per model."""
    with _VOCABS_LOCK:
        vocab = _VOCABS.get(model)
        if vocab is None:
            vocab = _VOCABS[model] = GrammarVocab(str(model.path), model.settings.kv_overrides)
        return vocab
