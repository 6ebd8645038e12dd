"""The worker's jobs as the step loop runs them (serving/worker.py)."""

import asyncio
import threading

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.engine.engine import Request
from ollama_spec.server.serving.worker import Finished, Worker


def test_a_steps_tokens_come_as_one_piece(spec_engine):
    """The step loop hands on a step's verified tokens together: one event each step, not one a token."""
    request = Request(
        prompt="Once upon a time",
        raw=True,
        max_tokens=48,
        ignore_eos=True,
        speculation=SpeculationSettings(num_speculative_tokens=4),
    )

    async def run():
        worker = Worker(spec_engine, max_queue=4, on_finished=lambda job, result: None)
        job, pieces = worker.submit(request), []
        while not isinstance(event := await asyncio.wait_for(job._events.get(), 60), Finished):
            pieces.append(event)
        worker.close()
        return pieces, event.result

    pieces, result = asyncio.run(run())
    assert "".join(piece.text for piece in pieces) == result.text
    steps = result.speculation.steps
    assert result.speculation.accepted > 0 and len(pieces) <= steps < len(result.tokens)


def test_a_finished_jobs_count_and_log_line_are_made_on_the_event_loops_thread(spec_engine):
    """Not on the step loop's thread, between two of its passes: the log's write lets go of the GIL, which
    the event loop's thread would take while the other slots wait."""
    request = Request(prompt="Once upon a time", raw=True, max_tokens=8, ignore_eos=True)
    finished = []

    async def run():
        loop_thread = threading.get_ident()
        worker = Worker(
            spec_engine, max_queue=4, on_finished=lambda job, result: finished.append(threading.get_ident())
        )
        job = worker.submit(request)
        async for event in job.events():
            last = event
        worker.close()
        return loop_thread, last

    loop_thread, last = asyncio.run(run())
    assert isinstance(last, Finished) and finished == [loop_thread]


def test_a_finished_jobs_log_line_comes_after_its_reader_took_the_end(spec_engine):
    """The answer's last chunks are written before the count and the log line are made: the client waits
    for them, the log does not."""
    request = Request(prompt="Once upon a time", raw=True, max_tokens=8, ignore_eos=True)
    order = []

    async def run():
        worker = Worker(spec_engine, max_queue=4, on_finished=lambda job, result: order.append("logged"))
        async for event in worker.submit(request).events():
            if isinstance(event, Finished):
                order.append("taken")
        await asyncio.sleep(0)
        worker.close()

    asyncio.run(run())
    assert order == ["taken", "logged"]
