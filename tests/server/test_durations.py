"""Ollama's durations count from the request's arrival, as Ollama's do (server/routes.go: checkpointStart):
a request queued behind another for the only slot says so in its total_duration and prompt_eval_duration
(Ollama's runner counts a sequence's prompt time from before it waits for a slot)."""

import threading
import time

import httpx
import ollama
import pytest

from ollama_spec.engine.engine import Engine
from tests.conftest import engine_settings
from tests.serving import running_server


@pytest.fixture(scope="module")
def url(tiny_models):
    with Engine(tiny_models[0], None, engine_settings(parallel=1)) as engine, running_server(engine) as (url, _):
        yield url


def test_a_request_queued_behind_a_long_one_counts_its_wait(url):
    long = {"model": "m", "prompt": "Once upon a time", "max_tokens": 1900, "ignore_eos": True, "stream": True}
    answers = {}
    with httpx.stream("POST", url + "/v1/completions", json=long, timeout=120) as stream:
        lines = stream.iter_lines()
        next(line for line in lines if line.startswith("data: {"))  # it holds the only slot
        sent = time.monotonic()

        def short() -> None:
            answers["short"] = ollama.Client(host=url).generate("m", "Hi", options={"num_predict": 2})

        thread = threading.Thread(target=short)
        thread.start()
        for _ in lines:  # the long one to its end; the short one waits for its slot meanwhile
            pass
        waited = time.monotonic() - sent
    thread.join(60)
    answer = answers["short"]
    assert waited > 0.3, "the long generation ended too soon to hold the short one up"
    # its wait is in its total, as Ollama's is (not all of it: it reached the server after `sent`, how
    # long after depends on the machine's load); its own generation alone takes milliseconds
    assert answer.total_duration / 1e9 >= 0.5 * waited
    assert answer.prompt_eval_duration / 1e9 >= 0.5 * waited - answer.load_duration / 1e9
    parts = answer.load_duration + answer.prompt_eval_duration + answer.eval_duration
    assert 0 < answer.eval_duration and parts <= answer.total_duration


def test_durations_add_up_to_the_total(url):
    answer = ollama.Client(host=url).chat("m", messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 4})
    parts = answer.load_duration + answer.prompt_eval_duration + answer.eval_duration
    assert 0 < answer.prompt_eval_duration and 0 < answer.eval_duration
    assert answer.total_duration - 1_000_000 <= parts <= answer.total_duration  # within a millisecond
