"""A timing's share of time spent waiting for a CPU, from Linux's per-thread schedstat."""

import threading

import pytest

from ollama_spec.engine import cpu_wait
from ollama_spec.engine.cpu_wait import BUSY_SHARE, CpuWait, waited_s

READING = waited_s  # the real reading, before the suite's quiet_machine fixture stands in for it


def test_the_waits_are_read_from_every_thread_of_the_process(tmp_path, monkeypatch):
    tasks = tmp_path / "task"
    for task, delay in (("1", 2_000_000_000), ("7", 500_000_000)):
        (tasks / task).mkdir(parents=True)
        (tasks / task / "schedstat").write_text(f"123456 {delay} 42\n")
    (tasks / "9").mkdir()  # a thread that ended while its stat was read
    monkeypatch.setattr(cpu_wait, "TASKS", str(tasks))
    assert READING() == pytest.approx(2.5)


def test_where_the_count_is_not_kept_every_timing_is_quiet(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_wait, "TASKS", str(tmp_path / "absent"))
    assert READING() is None
    monkeypatch.setattr(cpu_wait, "waited_s", READING)
    with CpuWait() as wait:
        pass
    assert wait.share == 0.0 and not wait.busy


def test_a_block_is_busy_by_its_threads_waits_against_its_wall_time(monkeypatch):
    readings = iter([10.0, 10.0 + 0.5 * BUSY_SHARE, 20.0, 20.0 + 2 * BUSY_SHARE])
    clock = iter([100.0, 101.0, 200.0, 201.0])
    monkeypatch.setattr(cpu_wait, "waited_s", lambda: next(readings))
    monkeypatch.setattr(cpu_wait.time, "perf_counter", lambda: next(clock))
    with CpuWait() as quiet:
        pass
    with CpuWait() as busy:
        pass
    assert not quiet.busy and quiet.share == pytest.approx(0.5 * BUSY_SHARE)
    assert busy.busy and "waited 30% of its time for a CPU" in str(busy)


@pytest.mark.skipif(READING() is None, reason="no per-thread schedstat here")
def test_the_reading_covers_threads_other_than_the_callers():
    """The waits of a thread that ran and ended count only while it lives; one alive is counted."""
    done = threading.Event()
    thread = threading.Thread(target=done.wait)
    thread.start()
    try:
        tasks = len(list(__import__("os").listdir(cpu_wait.TASKS)))
        assert tasks >= 2 and READING() >= 0.0
    finally:
        done.set()
        thread.join()
