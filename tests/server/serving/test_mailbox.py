"""A job's events from the step loop's thread to its asyncio loop (serving/mailbox.py): a
stream's first piece and its end wake the loop at once, the pieces between come at its next look. No
model: the events are put by hand, from another thread as the step loop puts them."""

import asyncio
import gc
import os
import threading
from pathlib import Path

import pytest

from ollama_spec.engine.engine import Request, Result
from ollama_spec.server.serving.mailbox import Mailbox
from ollama_spec.server.serving.worker import Failed, Finished, Job, Piece


def _counting_wakeups(mailbox: Mailbox) -> list[int]:
    """The mailbox's wake-ups of its loop, counted (one entry each)."""
    wakes, real = [], mailbox._wakeup

    def counted():
        wakes.append(1)
        return real()

    mailbox._wakeup = counted
    return wakes


def _from_thread(*events) -> None:
    """Put `events` on their jobs from another thread, one call each, in order."""
    putter = threading.Thread(target=lambda: [job.put(event) for job, event in events])
    putter.start()
    putter.join()


def test_pieces_of_a_fast_stream_wait_for_the_loops_look_and_its_end_wakes_it():
    async def run():
        loop = asyncio.get_running_loop()
        mailbox = Mailbox(loop, poll_s=3600)  # no look comes during the test
        wakes = _counting_wakeups(mailbox)
        job = Job(Request(), loop, mailbox=mailbox)
        events = job.events()
        _from_thread((job, Piece("Once")))
        assert len(wakes) == 1 and (await anext(events)).text == "Once"  # the first piece: at once
        _from_thread((job, Piece(" upon")))
        assert len(wakes) == 2 and (await anext(events)).text == " upon"  # the second within poll_s: looks begin
        _from_thread((job, Piece(" a")), (job, Piece(" time")))
        assert len(wakes) == 2  # put but not yet read: the loop was not woken for them
        result = Result(text="Once upon a time", finish_reason="stop")
        _from_thread((job, Finished(result)))
        assert len(wakes) == 3  # the end wakes it, and brings the pieces before it, to be sent with it
        end = await anext(events)
        assert end.result is result and end.piece.text == " a time"

    asyncio.run(run())


def test_pieces_between_come_at_the_loops_look():
    async def run():
        loop = asyncio.get_running_loop()
        job = Job(Request(), loop, mailbox=Mailbox(loop, poll_s=0.5))
        events = job.events()
        for text in "ab":
            _from_thread((job, Piece(text)))
            assert (await anext(events)).text == text
        _from_thread((job, Piece("c")))
        assert (await asyncio.wait_for(anext(events), 10)).text == "c"  # no end came: the timer brought it

    asyncio.run(run())


def test_a_slow_or_quiet_stream_wakes_the_loop_for_each_piece():
    """Pieces further apart than poll_s (a slow pair's steps) each wake the loop at once; so does the
    next piece once a look found nothing."""

    async def run():
        loop = asyncio.get_running_loop()
        mailbox = Mailbox(loop, poll_s=0.001)
        wakes = _counting_wakeups(mailbox)
        job = Job(Request(), loop, mailbox=mailbox)
        events = job.events()
        for i, text in enumerate("abc"):
            _from_thread((job, Piece(text)))
            assert len(wakes) == i + 1 and (await asyncio.wait_for(anext(events), 10)).text == text
            # more than poll_s: the next piece comes slowly, and a look the wake-up set (due before this
            # sleep ends, so run first) finds nothing, which ends the looks
            await asyncio.sleep(0.002)

    asyncio.run(run())


def test_each_jobs_first_piece_and_failure_wake_the_loop_while_another_streams():
    async def run():
        loop = asyncio.get_running_loop()
        mailbox = Mailbox(loop, poll_s=3600)
        wakes = _counting_wakeups(mailbox)
        first, second = Job(Request(), loop, mailbox=mailbox), Job(Request(), loop, mailbox=mailbox)
        streams = first.events(), second.events()
        for text in "xy":
            _from_thread((first, Piece(text)))
            assert (await anext(streams[0])).text == text
        _from_thread((first, Piece("z")), (second, Piece("p")))
        assert len(wakes) == 3  # the second job's first piece
        error = RuntimeError("gone")
        _from_thread((second, Failed(error)))
        assert len(wakes) == 3  # already due: the loop has yet to take the mail the last wake-up was for
        assert (await anext(streams[0])).text == "z"
        assert [(await anext(streams[1])).text, (await anext(streams[1])).error] == ["p", error]

    asyncio.run(run())


@pytest.mark.skipif(os.name != "posix", reason="where a loop cannot watch a pipe, call_soon_threadsafe wakes it")
def test_the_step_loops_thread_wakes_the_loop_without_letting_go_of_the_gil():
    """Not through call_soon_threadsafe, whose socket send lets go of the GIL: the loop's thread would take
    it then and run while the step loop waits (see mailbox.Wakeup)."""

    async def run():
        loop = asyncio.get_running_loop()
        job = Job(Request(), loop, mailbox=Mailbox(loop, poll_s=3600))
        events, threadsafe = job.events(), []
        loop.call_soon_threadsafe = lambda *args, **kwargs: threadsafe.append(args)
        _from_thread((job, Piece("Once")))
        assert (await asyncio.wait_for(anext(events), 10)).text == "Once"
        assert threadsafe == []

    asyncio.run(run())


def test_a_piece_for_a_closed_loop_cancels_its_job():
    loop = asyncio.new_event_loop()
    job = Job(Request(), loop, mailbox=Mailbox(loop))
    loop.close()
    _from_thread((job, Piece("Once")))
    assert job.cancelled


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts the open file descriptors in /proc")
def test_the_mailboxes_of_closed_loops_leave_no_file_open():
    def opened() -> int:
        gc.collect()
        return len(os.listdir("/proc/self/fd"))

    async def one():
        job = Job(Request(), asyncio.get_running_loop())  # its own Mailbox
        _from_thread((job, Piece("Once")))
        await asyncio.wait_for(anext(job.events()), 10)

    asyncio.run(one())  # the first loop opens what every loop shares (its selector's module state)
    before = opened()
    for _ in range(20):
        asyncio.run(one())
    assert opened() == before
