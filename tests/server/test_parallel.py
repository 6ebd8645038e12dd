"""serve --parallel: requests run together in slots of their own, and a chat front-end's background
requests between two turns of a chat cost the chat nothing."""

import threading
import time

import httpx
import pytest
from openai import OpenAI

from ollama_spec.engine.engine import Engine
from tests.conftest import engine_settings
from tests.serving import running_server

PROMPTS = ["The quick brown fox", "Once upon a time", "In a hole in the ground", "It was a bright cold day"]


@pytest.fixture(scope="module")
def served(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=4)) as engine:
        with running_server(engine) as (url, state):
            yield url, state


def complete(url, prompt, results):
    body = {"model": "m", "prompt": prompt, "max_tokens": 48, "temperature": 0, "ignore_eos": True}
    results[prompt] = httpx.post(url + "/v1/completions", json=body, timeout=120).json()["choices"][0]["text"]


def test_four_concurrent_greedy_requests_give_what_each_gives_alone(served):
    url, state = served
    alone = {}
    for prompt in PROMPTS:
        complete(url, prompt, alone)
    together = {}
    threads = [threading.Thread(target=complete, args=(url, prompt, together)) for prompt in PROMPTS]
    decodes = state.serving.served.engine.loop.decodes
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert together == alone
    assert state.serving.served.engine.loop.decodes > decodes  # they ran as batches


def test_health_counts_running_and_waiting_per_slot(served):
    assert httpx.get(served[0] + "/health").json()["waiting"] == 0


CHAT = [
    {"role": "system", "content": "You are a helpful assistant. " * 20},
    {"role": "user", "content": "Tell me about the history of the printing press, in detail. " * 6},
]
# what Open WebUI sends after each turn: a title, then tags, each with the chat inside its own prompt
TITLE = "Create a concise, 3-5 word title with an emoji summarizing the chat history.\n### Chat History:\n"
TAGS = "Generate 1-3 broad tags categorizing the main themes of the chat history.\n### Chat History:\n"


def _background(history):
    text = "\n".join(f"{m['role'].upper()}: {m['content']}" for m in history)
    return [[{"role": "user", "content": TITLE + text}], [{"role": "user", "content": TAGS + text}]]


def _openai_session(url):
    """A chat turn, Open WebUI's title and tags requests, the next turn: (the first turn's prompt
    tokens, how many of the next turn's were cached)."""
    client = OpenAI(base_url=url + "/v1", api_key="unused")
    first = client.chat.completions.create(model="m", messages=CHAT, max_tokens=24, temperature=0)
    history = [*CHAT, {"role": "assistant", "content": first.choices[0].message.content}]
    for messages in _background(history):
        client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0)
    turn = [*history, {"role": "user", "content": "And what came after it?"}]
    second = client.chat.completions.create(model="m", messages=turn, max_tokens=8, temperature=0)
    return first.usage.prompt_tokens, second.usage.prompt_tokens_details.cached_tokens


def test_the_open_webui_pattern_reuses_the_chat_on_the_openai_route(served):
    prompt, cached = _openai_session(served[0])
    assert cached >= 0.9 * prompt, (cached, prompt)


def test_the_open_webui_pattern_reuses_the_chat_on_the_ollama_route(served):
    import ollama

    client = ollama.Client(host=served[0])
    first = client.chat(model="m", messages=CHAT, options={"num_predict": 24, "temperature": 0})
    history = [*CHAT, {"role": "assistant", "content": first.message.content}]
    for messages in _background(history):
        client.chat(model="m", messages=messages, options={"num_predict": 8, "temperature": 0})
    turn = [*history, {"role": "user", "content": "And what came after it?"}]
    answer = httpx.post(
        served[0] + "/api/chat",
        timeout=120,
        json={"model": "m", "messages": turn, "stream": False, "options": {"num_predict": 8, "temperature": 0}},
    ).json()
    cached = answer["speculation"]["prompt_cached_tokens"]
    assert cached >= 0.9 * first.prompt_eval_count, (cached, first.prompt_eval_count)


def test_one_slot_keeps_the_chat_in_host_ram(tiny_models):
    """With a single slot, the background requests take the chat's slot; its prefix comes back from RAM."""
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=1)) as engine:
        with running_server(engine) as (url, state):
            prompt, cached = _openai_session(url)
            assert cached >= 0.9 * prompt, (cached, prompt)
            assert state.serving.served.engine.pool.restored_tokens > 0


def test_embeddings_at_once_in_several_slots_all_answer(served):
    """The slots' threads share one embedding context: they take turns on it."""
    url = served[0]
    answers = []
    threads = [
        threading.Thread(
            target=lambda i=i: answers.append(
                httpx.post(url + "/api/embed", json={"model": "m", "input": f"hello world {i} " * 40}, timeout=120)
            )
        )
        for i in range(12)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert sorted(a.status_code for a in answers) == [200] * 12
    vectors = [a.json()["embeddings"][0] for a in answers]
    assert all(len(v) == len(vectors[0]) for v in vectors)


def test_a_client_that_leaves_mid_stream_frees_its_slot_and_the_others_finish(served):
    url, _ = served
    alone = {}
    for prompt in PROMPTS[:2]:
        complete(url, prompt, alone)
    together = {}
    threads = [threading.Thread(target=complete, args=(url, prompt, together)) for prompt in PROMPTS[:2]]
    body = {"model": "m", "prompt": PROMPTS[2], "max_tokens": 1500, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=120) as response:
        for thread in threads:
            thread.start()
        for i, _ in enumerate(response.iter_lines()):
            if i > 5:
                break  # the client leaves; its slot's generation stops at its next token
    for thread in threads:
        thread.join(120)
    assert together == alone
    # the job's log line and metrics run after the reader's last turn (worker.Job.take), and the left
    # stream's job ends at its next step: a few event-loop turns after the others may have finished
    deadline = time.monotonic() + 10
    while 'outcome="cancelled"' not in (metrics := httpx.get(url + "/metrics").text) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 'outcome="cancelled"' in metrics
