"""StepBatcher's bookkeeping over a stand-in model: one decode for the slots that wait, and each
slot's share of the batch (what its K policy pays)."""

import threading

import numpy as np

from ollama_spec.llama.batcher import StepBatcher


class Recorder:
    """Answers each sequence's evaluation with one row per asked row; remembers the batches."""

    def __init__(self):
        self.batches = []

    def decode_many(self, items):
        self.batches.append([(seq, len(tokens)) for seq, tokens, _ in items])
        return [np.zeros((n_rows, 4)) for _, _, n_rows in items]


def test_slots_that_all_wait_run_as_one_batch_and_each_learns_its_share():
    model = Recorder()
    batcher = StepBatcher([model])
    asked = {0: [1, 2, 3], 1: [4]}
    got, ready = {}, threading.Barrier(2)

    def slot(seq):
        with batcher.slot():
            ready.wait()
            got[seq] = batcher.evaluate(model, seq, asked[seq], 1)

    threads = [threading.Thread(target=slot, args=(seq,)) for seq in asked]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    assert len(model.batches) == 1 and sorted(model.batches[0]) == [(0, 3), (1, 1)]
    assert got[0][1] == 0.75 and got[1][1] == 0.25
    assert got[0][0].shape == (1, 4)


def test_a_lone_slot_has_the_whole_batch():
    model = Recorder()
    batcher = StepBatcher([model])
    with batcher.slot():
        rows, share = batcher.evaluate(model, 0, [1, 2], 2)
    assert share == 1.0 and rows.shape == (2, 4)
