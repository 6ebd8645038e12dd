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


WAITED = cpu_wait.thread_waited_s  # the real one, before the suite's quiet_machine fixture stands in for it


def running(monkeypatch, readings):
    """running_clock over `readings`, each (the clock, the thread's waits, the clock again) as one reading
    sees them; a fresh thread for each test."""
    clocks = iter(c for before, _, after in readings for c in (before, after))
    waits = iter(waited for _, waited, _ in readings)
    monkeypatch.setattr(cpu_wait, "_own", threading.local())
    monkeypatch.setattr(cpu_wait, "thread_waited_s", lambda: next(waits))
    return lambda: cpu_wait.running_clock(lambda: next(clocks))


def test_the_running_clock_stands_still_while_the_thread_waits_for_a_core(monkeypatch):
    """Between two readings it moves by the wall time less the waits, never by less than nothing."""
    readings = [
        (10.0, 5.0, 10.0),  # the first reading: where the count starts
        (10.1, 5.0, 10.1),  # ran throughout
        (10.2, 5.05, 10.2),  # waited half of it for a core
        (10.3, 5.25, 10.3),  # waits said larger than the time gone by: at most that
    ]
    clock = running(monkeypatch, readings)
    assert [clock() for _ in readings] == pytest.approx([10.0, 10.1, 10.15, 10.15])


def test_a_wait_between_the_clocks_reading_and_the_waits_is_read_again(monkeypatch):
    """A reading whose two clock readings lie apart had a wait come between: the waits counted may or may
    not hold it, and the clock is read again with them."""
    clock = running(
        monkeypatch,
        [
            (10.0, 5.0, 10.0),
            (10.1, 5.0, 10.104),  # 4 ms went between: on which side of the waits' reading is unknown
            (10.104, 5.004, 10.104),  # read again: the 4 ms are waits
        ],
    )
    assert [clock(), clock()] == pytest.approx([10.0, 10.1])


def test_without_a_schedstat_the_running_clock_is_the_clock(tmp_path, monkeypatch):
    monkeypatch.setattr(cpu_wait, "TASKS", str(tmp_path / "absent"))
    monkeypatch.setattr(cpu_wait, "_own", threading.local())
    monkeypatch.setattr(cpu_wait, "thread_waited_s", WAITED)
    assert WAITED() is None
    ticks = iter([1.0, 1.0, 2.0, 2.0])
    assert [cpu_wait.running_clock(lambda: next(ticks)) for _ in range(2)] == [1.0, 2.0]
