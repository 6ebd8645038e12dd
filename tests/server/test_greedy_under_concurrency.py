"""Issue #45: a greedy request gets one answer, whatever the server ran before it or runs beside it.

Four prompts, sent one at a time and then four at once, for three rounds, to a pair served with four
slots: every prompt gets one text and one list of log-probabilities (the same bits), the answer it
gets from the target served alone. The pair is small and F16, its best two tokens often close
(tests/builders/close_pair.py), so a difference in rounding shows in the text within a few dozen tokens.
"""

import threading
from contextlib import contextmanager

import httpx
import pytest

from ollama_spec.engine.engine import Engine
from ollama_spec.models.resolve import resolve_model
from tests.builders.close_pair import build_close_pair
from tests.conftest import engine_settings
from tests.serving import running_server

PROMPTS = [f"the river ran past the {i}" for i in range(4)]
ROUNDS = 3


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    root = tmp_path_factory.mktemp("close-store")
    target, draft = build_close_pair(root)
    return resolve_model(target, str(root)), resolve_model(draft, str(root))


@contextmanager
def served(target, draft):
    with Engine(target, draft, engine_settings(parallel=4, n_ctx=1024)) as engine:
        with running_server(engine) as (url, _):
            yield url


def complete(url, prompt, results):
    body = {"model": "m", "prompt": prompt, "max_tokens": 64, "temperature": 0, "ignore_eos": True, "logprobs": 1}
    choice = httpx.post(url + "/v1/completions", json=body, timeout=120).json()["choices"][0]
    results[prompt] = (choice["text"], tuple(choice["logprobs"]["token_logprobs"]))


def alone(url):
    results = {}
    for prompt in PROMPTS:
        complete(url, prompt, results)
    return results


def together(url):
    results = {}
    threads = [threading.Thread(target=complete, args=(url, prompt, results)) for prompt in PROMPTS]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    return results


def test_alone_then_four_at_once_three_times_gives_each_prompt_the_target_alones_answer(pair):
    with served(pair[0], None) as url:
        expected = alone(url)
    answers = {prompt: set() for prompt in PROMPTS}
    with served(*pair) as url:
        for _ in range(ROUNDS):
            for results in (alone(url), together(url)):
                for prompt, answer in results.items():
                    answers[prompt].add(answer)
        for prompt, answer in alone(url).items():
            answers[prompt].add(answer)
    parted = {prompt: len(got) for prompt, got in answers.items() if len(got) > 1}
    assert not parted, f"answers per prompt: {parted}"
    assert {prompt: got.pop() for prompt, got in answers.items()} == expected
