"""StepBatcher's bookkeeping over a stand-in model: one decode for the slots that wait, and what each
slot's clock leaves out (the other slots' part of the batches it waited through)."""

import threading

import numpy as np
import pytest

from ollama_spec.llama import batcher as batcher_module
from ollama_spec.llama.batcher import StepBatcher, _BatchLine


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class SlowModel:
    """Answers each sequence with one row per asked row; a batch takes `fixed + per_token·tokens` s
    on `clock`, which nothing else moves (the test's timings are exact whatever the machine's load)."""

    def __init__(self, clock, fixed=0.02, per_token=0.005):
        self.clock, self.fixed, self.per_token = clock, fixed, per_token
        self.batches = []

    def decode_many(self, items):
        self.batches.append([(seq, len(tokens)) for seq, tokens, _ in items])
        self.clock.now += self.fixed + self.per_token * sum(len(tokens) for _, tokens, _ in items)
        return [np.zeros((rows, 4)) for _, _, rows in items]


def test_the_batch_time_splits_as_a_fixed_share_and_each_slots_tokens():
    line = _BatchLine()
    for total in (4, 8, 12, 28, 5, 16):  # batches of many sizes, each timed as 20 ms + 3 ms a token
        line.split(0.020 + 0.003 * total, [total // 2, total - total // 2])
    shares = line.split(0.020 + 0.003 * 28, [1, 7, 10, 10])
    assert sum(shares) == pytest.approx(0.104)
    assert shares == pytest.approx([0.005 + 0.003 * n for n in (1, 7, 10, 10)], abs=1e-6)
    # a first batch, with nothing to fit: no share below zero nor above the batch
    first = _BatchLine().split(0.05, [3, 1])
    assert sum(first) == pytest.approx(0.05) and min(first) >= 0


def test_a_slots_clock_leaves_out_the_time_spent_on_the_others(monkeypatch):
    """Two slots batch round after round; in the last, one brings 1 token and the other 9: the first
    waited through the whole pass, of which only half the fixed part and its token were its own."""
    clock = FakeClock()
    monkeypatch.setattr(batcher_module.time, "perf_counter", clock)
    model = SlowModel(clock, fixed=0.02, per_token=0.005)
    batcher = StepBatcher([model])
    rounds = [(1, 9), (2, 2), (3, 5), (1, 1), (4, 8), (6, 6), (1, 9)]
    spent = {0: [], 1: []}
    ready = threading.Barrier(2)

    def slot(seq):
        with batcher.slot():
            for sizes in rounds:
                ready.wait()
                before = batcher.others_seconds()
                batcher.evaluate(model, seq, [0] * sizes[seq], 1)
                spent[seq].append(batcher.others_seconds() - before)

    threads = [threading.Thread(target=slot, args=(seq,)) for seq in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(model.batches) == len(rounds)  # one pass a round for both slots
    last = 0.02 + 0.005 * 10
    assert spent[0][-1] == pytest.approx(last - (0.01 + 0.005 * 1), abs=1e-9)
    assert spent[1][-1] == pytest.approx(last - (0.01 + 0.005 * 9), abs=1e-9)
    assert batcher.others_seconds() == 0  # a thread that never joined spent nothing on anyone


def test_every_batch_runs_on_the_batchers_own_thread():
    """Not on the slot thread that arrived last: llama.cpp's OpenMP keeps a team of workers per calling
    thread, and the teams of earlier callers spin on the cores the next batch needs."""
    callers = []

    class Recording(SlowModel):
        def decode_many(self, items):
            callers.append(threading.get_ident())
            return super().decode_many(items)

    model = Recording(FakeClock())
    batcher = StepBatcher([model])
    slot_threads = set()
    ready = threading.Barrier(3)

    def slot(seq):
        slot_threads.add(threading.get_ident())
        with batcher.slot():
            for _ in range(5):
                ready.wait()
                batcher.evaluate(model, seq, [0], 1)

    threads = [threading.Thread(target=slot, args=(seq,)) for seq in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    batcher.close()
    assert len(model.batches) == 5 and all(len(batch) == 3 for batch in model.batches)
    assert len(set(callers)) == 1 and not set(callers) & slot_threads
