"""HostMemory: a spare region made ready for the save expected, taken by it, its unused pages given back."""

import sys
import time

import psutil
import pytest

from ollama_spec.llama.host_memory import MIN_READY_BYTES, PAGE, SHRINK_PAST, HostMemory

MIB = 1024 * 1024
MOST = 256 * MIB  # what a save may take (the saved prefixes' budget)
LEAST = MIN_READY_BYTES  # the smallest save made ready for


def settled(condition, timeout=10.0):
    """Wait for the memory's thread to do what `condition` checks."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the memory's thread did not get there"
        time.sleep(0.005)


@pytest.fixture
def memory():
    memory = HostMemory()
    yield memory
    memory.close()


def test_a_save_takes_the_spare_made_ready_and_another_is_made(memory):
    memory.expect(0, LEAST + 3 * PAGE + 5, MOST)
    settled(lambda: memory.spare == LEAST + 3 * PAGE + 5)
    taken = memory.take(LEAST + 3 * PAGE)
    assert isinstance(taken, memoryview) and len(taken) == LEAST + 3 * PAGE and not taken.readonly
    taken[:4] = b"cell"  # llama.cpp writes the cells into it
    settled(lambda: memory.spare == LEAST + 3 * PAGE + 5)
    again = memory.take(LEAST + 3 * PAGE)
    assert bytes(again[:4]) == bytes(4)  # a region of its own: the first save's bytes stay the first's
    assert bytes(taken[:4]) == b"cell"


def test_a_save_larger_than_the_spare_gets_fresh_memory_and_leaves_the_spare(memory):
    memory.expect(0, LEAST + 2 * PAGE, MOST)
    settled(lambda: memory.spare == LEAST + 2 * PAGE)
    taken = memory.take(LEAST + 5 * PAGE)
    assert isinstance(taken, bytearray) and len(taken) == LEAST + 5 * PAGE
    assert memory.spare == LEAST + 2 * PAGE


def test_nothing_is_made_ready_past_the_bound_under_the_least_or_before_a_save_is_expected(memory):
    assert isinstance(memory.take(PAGE), bytearray)
    memory.expect(0, MOST + 1, MOST)
    memory.expect(1, LEAST - 1, MOST)  # fresh memory is quick enough for it: no thread at all
    time.sleep(0.05)
    assert memory.spare == 0 and memory._thread is None


def test_the_spare_is_as_large_as_the_largest_save_that_may_come(memory):
    memory.expect(0, LEAST + 2 * PAGE, MOST)
    memory.expect(1, LEAST + 5 * PAGE, MOST)
    memory.expect(2, LEAST + 3 * PAGE, MOST)
    settled(lambda: memory.spare == LEAST + 5 * PAGE)
    memory.drop(1)  # slot 1 taken again: its cache will not be saved as it is
    memory.expect(2, LEAST + 4 * PAGE, MOST)
    time.sleep(0.05)
    assert memory.spare == LEAST + 5 * PAGE  # within SHRINK_PAST of the largest left: it stays


def test_a_spare_far_larger_than_any_save_that_may_come_is_made_again_at_that_size(memory):
    memory.expect(0, 4 * SHRINK_PAST * LEAST, MOST)
    memory.expect(1, LEAST, MOST)
    settled(lambda: memory.spare == 4 * SHRINK_PAST * LEAST)
    memory.drop(0)
    settled(lambda: memory.spare == LEAST)


@pytest.mark.skipif(sys.platform != "linux", reason="resident memory read as Linux counts it")
def test_the_pages_past_what_a_save_uses_go_back_to_the_system(memory):
    process = psutil.Process()
    memory.expect(0, 128 * MIB, MOST)
    settled(lambda: memory.spare == 128 * MIB)
    before = process.memory_info().rss
    memory.drop(0)
    memory.expect(1, LEAST, MOST)
    taken = memory.take(PAGE)  # a small save in the large spare: the rest given back
    settled(lambda: memory.spare == LEAST)  # and the next spare a small one
    settled(lambda: process.memory_info().rss < before - 64 * MIB)
    assert len(taken) == PAGE


def test_closed_it_makes_nothing_more_and_its_thread_ends(memory):
    memory.expect(0, LEAST, MOST)
    settled(lambda: memory.spare == LEAST)
    thread = memory._thread
    memory.close()
    memory.expect(1, 2 * LEAST, MOST)
    assert memory.spare == 0 and not thread.is_alive()
