"""A grammar whose every check takes minutes (1,500 optional items: llama.cpp advances each token through a
parse stack per prefix) must not hold its model once its client has gone, nor keep the server from
stopping. Served in a process of its own: the check given up on runs to its end on a thread there."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager

import httpx
import ollama
import openai
import pytest

OPTIONAL_ITEMS = "root ::= " + " ".join(['"a"?'] * 1500)  # 8 KB
HI = [{"role": "user", "content": "Hi"}]
BOUND = 2  # seconds; above what the tiny pair takes for anything but this grammar


@pytest.fixture
def server(tiny_store):
    """`serve` over the tiny store in a subprocess (one slot); yields (URL, process). Killed afterwards."""
    with _serving(tiny_store) as served:
        yield served


@pytest.fixture
def quick_bound_server(tiny_store):
    """As `server`, with a grammar check bounded at BOUND seconds rather than the product's 10: the
    grammar's checks take minutes either way, and the test need not wait out the longer bound."""
    with _serving(
        tiny_store, f"import ollama_spec.llama.grammar_calls as c; c.GRAMMAR_CALL_SECONDS = {BOUND}; "
    ) as served:
        yield served


@contextmanager
def _serving(tiny_store, setup: str = ""):
    command = [sys.executable, "-c", setup + "from ollama_spec.cli import main; main()", "serve", "--port", "0"]
    command += ["--threads", "1", "--parallel", "1", "--no-check", "--no-upstream", "--models-dir", str(tiny_store)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        url = None
        for line in process.stderr:
            if found := re.search(r"on (http://127\.0\.0\.1:\d+)", line):
                url = found.group(1)
                break
        assert url, "the server did not say where it listens"
        threading.Thread(target=process.stderr.read, daemon=True).start()  # keep the pipe drained
        assert _chat(url).message.content is not None  # loaded: no load in what follows
        yield url, process
    finally:
        process.kill()
        process.wait()


def _chat(url: str, timeout: float = 60):
    return ollama.Client(host=url, timeout=timeout).chat(model="tiny-target", messages=HI, options={"num_predict": 3})


def _with_grammar(url: str, timeout: float) -> None:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=timeout)
    client.chat.completions.create(
        model="tiny-target", messages=HI, max_tokens=50, extra_body={"grammar": OPTIONAL_ITEMS}
    )


def test_a_client_that_leaves_frees_its_model_whatever_grammar_it_carried(server):
    url, _ = server
    with pytest.raises(openai.APITimeoutError):
        _with_grammar(url, timeout=3)
    assert _chat(url, timeout=30).message.content is not None  # the one slot is free again
    assert httpx.get(url + "/health", timeout=10).json()["waiting"] == 0


def test_sigterm_stops_the_server_while_a_grammar_check_runs(server):
    url, process = server
    waiting = threading.Thread(target=lambda: pytest.raises(openai.APIError, _with_grammar, url, 60), daemon=True)
    waiting.start()
    time.sleep(2)  # the request is in its first grammar check by now (not needed for the test to hold)
    process.send_signal(signal.SIGTERM)
    assert process.wait(15) == 0


def test_a_grammar_check_past_its_bound_is_an_error_to_the_client(quick_bound_server):
    url, _ = quick_bound_server
    with pytest.raises(openai.BadRequestError) as refused:
        _with_grammar(url, timeout=120)
    assert f"the output grammar took more than {BOUND} s to check one token" in refused.value.message
    assert _chat(url, timeout=30).message.content is not None
