"""The scheduler as the one owner of load, evict, unload and delete: a delete waits for a load in progress and
for the running requests of the model, a copy over a loaded name is loaded again, and nothing is closed under
a request. Real engines over a copy of the tiny store, driven on one event loop (and over HTTP)."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import ollama
import openai
import pytest

from ollama_spec.pull.edits import delete_model
from ollama_spec.server.protocol.errors import api_error
from ollama_spec.server.serving import scheduler as scheduler_module
from ollama_spec.server.serving.metrics import Metrics
from ollama_spec.server.serving.pairs import StorePairs
from ollama_spec.server.serving.scheduler import Scheduler, SchedulerSettings
from tests.conftest import engine_settings
from tests.serving import get, post, running_store

LIBRARY = ("manifests", "registry.ollama.ai", "library")
CHAT = {"stream": False, "options": {"num_predict": 8, "temperature": 0}}


def scheduler(store) -> Scheduler:
    pairs = StorePairs(models_dir=str(store), no_draft=True, engine=engine_settings(parallel=1))
    return Scheduler(pairs, SchedulerSettings(), Metrics(lambda: 0), max_queue=4)


def answer(url: str, model: str) -> str:
    reply = post(url + "/api/generate", json={"model": model, "prompt": "Once upon"} | CHAT)
    assert reply.status_code == 200, reply.text
    return reply.json()["response"]


def test_a_delete_waits_for_the_running_request_then_closes_and_removes(store_copy):
    async def scenario():
        owner = scheduler(store_copy)
        served = await owner.acquire("tiny-alien", None)  # a request holds it
        deleting = asyncio.ensure_future(owner.delete("tiny-alien", lambda key: delete_model(key, str(store_copy))))
        await asyncio.sleep(0.6)
        assert not deleting.done() and not served.closed  # never closed under a running request
        assert "tiny-alien:latest" not in owner.loaded  # but no new request gets it
        refused = await asyncio.gather(owner.acquire("tiny-alien", None), return_exceptions=True)
        assert api_error(refused[0]).status == 404  # the answer it gets
        assert store_copy.joinpath(*LIBRARY, "tiny-alien", "latest").exists()
        await owner.release(served)
        deleted = await asyncio.wait_for(deleting, 30)
        assert served.closed and deleted.name == "tiny-alien:latest"
        assert not store_copy.joinpath(*LIBRARY, "tiny-alien", "latest").exists()
        owner.shutdown()

    asyncio.run(scenario())


def test_a_delete_during_the_models_own_load_waits_for_it_and_leaves_nothing_loaded(store_copy):
    async def scenario():
        owner = scheduler(store_copy)
        started, go = asyncio.Event(), asyncio.Event()

        async def held(key):  # the load waits here, holding the scheduler, until the delete has begun
            started.set()
            await go.wait()

        owner.before_load = held
        loading = asyncio.ensure_future(owner.acquire("tiny-alien", None))
        await asyncio.wait_for(started.wait(), 60)
        deleting = asyncio.ensure_future(owner.delete("tiny-alien", lambda key: delete_model(key, str(store_copy))))
        for _ in range(6000):  # the delete has named the model: it now waits for the load's lock
            if owner._deleting:
                break
            await asyncio.sleep(0.01)
        go.set()
        got = (await asyncio.gather(loading, return_exceptions=True))[0]
        if isinstance(got, Exception):  # the delete took the pair before the request resumed: 404, as after it
            assert api_error(got).status == 404, got
        else:
            await owner.release(got)
        await asyncio.wait_for(deleting, 60)
        assert isinstance(got, Exception) or got.closed
        assert owner.loaded == {} and owner.unloading == []
        assert not store_copy.joinpath(*LIBRARY, "tiny-alien", "latest").exists()
        owner.shutdown()

    asyncio.run(scenario())


def test_a_model_deleted_between_its_read_and_its_plan_is_a_404_not_a_broken_store(store_copy):
    """A delete that lands after a request read the model's name but before its load planned (a request
    retrying after the delete closed its pair) finds the files gone: not found, as after the delete."""

    async def scenario():
        owner = scheduler(store_copy)

        async def deleted(key):  # what a delete running beside the request did meanwhile
            await asyncio.to_thread(delete_model, key, str(store_copy))

        owner.before_load = deleted
        got = (await asyncio.gather(owner.acquire("tiny-alien", None), return_exceptions=True))[0]
        assert isinstance(got, Exception) and api_error(got).status == 404, got
        assert owner.loaded == {}
        owner.shutdown()

    asyncio.run(scenario())


def test_a_copy_over_a_loaded_name_answers_with_the_new_weights(store_copy):
    with running_store(store_copy, no_draft=True) as (url, _):
        draft_said, target_said = answer(url, "tiny-alien"), answer(url, "tiny-target")
        assert draft_said != target_said  # two different models: the test can tell them apart
        shown_before = post(url + "/api/show", json={"model": "tiny-alien"}).json()["model_info"]
        ollama.Client(host=url).copy("tiny-target", "tiny-alien")
        assert answer(url, "tiny-alien") == target_said
        shown = post(url + "/api/show", json={"model": "tiny-alien"}).json()["model_info"]
        target_shown = post(url + "/api/show", json={"model": "tiny-target"}).json()["model_info"]
        assert shown == target_shown != shown_before
        running = [m["name"] for m in get(url + "/api/ps").json()["models"]]
        assert sorted(running) == ["tiny-alien:latest", "tiny-target:latest"]  # the old weights unloaded


def test_a_copy_made_by_another_process_is_seen_at_the_next_request(store_copy):
    """Another writer (`ollama cp`, or `ollama-spec pull` in a shell) does not tell the server: the request
    itself finds the manifest changed, as Ollama compares the model's path at each request."""
    with running_store(store_copy, no_draft=True) as (url, _):
        target_said = answer(url, "tiny-target")
        answer(url, "tiny-alien")
        source = store_copy.joinpath(*LIBRARY, "tiny-target", "latest")
        store_copy.joinpath(*LIBRARY, "tiny-alien", "latest").write_bytes(source.read_bytes())
        assert answer(url, "tiny-alien") == target_said


def test_requests_and_deletes_of_one_model_at_once_never_answer_500(store_copy):
    """The race as found: a delete fired while the model's first request loads it; /api/ps meanwhile."""
    with running_store(store_copy, no_draft=True) as (url, _):
        statuses: list[int] = []

        def chat() -> None:
            body = {"model": "tiny-alien", "messages": [{"role": "user", "content": "Hi"}]} | CHAT
            statuses.append(post(url + "/api/chat", json=body).status_code)

        threads = [threading.Thread(target=chat) for _ in range(3)]
        for thread in threads:
            thread.start()
        deleted = ollama.Client(host=url).delete("tiny-alien")
        for thread in threads:
            thread.join(60)
        assert deleted.status == "success"
        assert set(statuses) <= {200, 404}, statuses
        ps = get(url + "/api/ps")
        assert ps.status_code == 200 and ps.json()["models"] == []
        assert not store_copy.joinpath(*LIBRARY, "tiny-alien", "latest").exists()


def test_load_duration_is_the_load_the_request_waited_for(store_copy, monkeypatch):
    """Ollama's durations, through its own client: a cold request's load is in load_duration and in its total.
    The tiny model loads in ~10 ms, as long as a warm request's own hiccups on a busy machine, so each load
    is made to take at least LOAD_S more (a slow disk, as a big model's load is): the real engine still loads."""
    load_s = 0.4
    real_load = scheduler_module.Engine.load

    def slow_load(*args, **kwargs):
        time.sleep(load_s)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(scheduler_module.Engine, "load", slow_load)
    with running_store(store_copy, no_draft=True) as (url, _):
        client = ollama.Client(host=url)
        cold = client.generate("tiny-alien", "Once upon", options={"num_predict": 4, "temperature": 0})
        warm = client.generate("tiny-alien", "Once upon", options={"num_predict": 4, "temperature": 0})
        assert cold.load_duration >= load_s * 1e9
        assert cold.total_duration >= cold.load_duration + cold.eval_duration
        assert warm.load_duration < load_s * 1e9
        chat = client.chat("tiny-target", messages=[{"role": "user", "content": "Hi"}], options={"num_predict": 2})
        assert chat.load_duration > 0 and chat.total_duration > chat.load_duration


def test_a_larger_num_ctx_reloads_the_model_and_ps_says_so(store_copy):
    """Open WebUI's fix for a cut prompt: Controls -> num_ctx. The model loads again with that context (as
    Ollama reloads its runner), a smaller one reuses the loaded pair, and past the trained length it is capped."""
    with running_store(store_copy, no_draft=True) as (url, _):
        client = ollama.Client(host=url)

        def context() -> int:
            return {m.model: m for m in client.ps().models}["tiny-alien:latest"].context_length

        client.generate("tiny-alien", "Once", options={"num_predict": 2})
        assert context() == 4096  # Ollama's default on a CPU
        client.generate("tiny-alien", "Once", options={"num_predict": 2, "num_ctx": 6000})
        assert context() == 6000
        client.generate("tiny-alien", "Once", options={"num_predict": 2, "num_ctx": 2048})
        assert context() == 6000  # a smaller context fits in the loaded one: no reload
        client.generate("tiny-alien", "Once", options={"num_predict": 2})
        assert context() == 6000
        client.generate("tiny-alien", "Once", options={"num_predict": 2, "num_ctx": 100_000})
        assert context() == 8192  # the model's trained length
        client.chat("tiny-alien", messages=[{"role": "user", "content": "Hi"}], options={"num_ctx": 100_000})
        assert context() == 8192  # no reload for what it cannot give


def test_a_num_ctx_that_does_not_fit_keeps_the_loaded_context(store_copy):
    """Past what the memory plan allows, the loaded pair answers (its context as before, the prompt fitted
    to it as usual) instead of an error: the request asked for more room, not for a failure."""
    from ollama_spec.planning.devices import system_ram

    engine = engine_settings(parallel=1, memory_check=True)
    store = StorePairs(models_dir=str(store_copy), no_draft=True, engine=engine)
    need = {n: store.plan("tiny-alien", [system_ram(64)], n_ctx=n).plan.host_bytes for n in (4096, 8192)}
    assert need[8192] > need[4096]
    budget = (need[4096] + need[8192]) // 2
    with running_store(store_copy, SchedulerSettings(memory_budget=budget), no_draft=True, engine=engine) as (url, _):
        client = ollama.Client(host=url)
        client.generate("tiny-alien", "Once", options={"num_predict": 2})
        answered = client.generate("tiny-alien", "Once", options={"num_predict": 2, "num_ctx": 8192})
        assert answered.done
        assert [m.context_length for m in client.ps().models] == [4096]


def test_a_load_that_waits_too_long_for_room_is_a_503_with_retry_after(store_copy):
    async def scenario():
        pairs = StorePairs(models_dir=str(store_copy), no_draft=True, engine=engine_settings(parallel=1))
        owner = Scheduler(pairs, SchedulerSettings(max_loaded=1, load_timeout=0.3), Metrics(lambda: 0), 4)
        busy = await owner.acquire("tiny-alien", None)  # a request holds the only room
        refused = (await asyncio.gather(owner.acquire("tiny-target", None), return_exceptions=True))[0]
        answered = api_error(refused)
        assert answered.status == 503 and answered.headers["Retry-After"].isdigit()
        assert list(owner.loaded) == ["tiny-alien:latest"] and not busy.closed
        await owner.release(busy)
        served = await owner.acquire("tiny-target", None)  # room now: the idle one makes way
        assert list(owner.loaded) == ["tiny-target:latest"] and busy.closed
        await owner.release(served)
        owner.shutdown()

    asyncio.run(scenario())


def test_a_chat_longer_than_the_loaded_context_loads_the_context_it_needs(store_copy, caplog):
    """Open WebUI's long chats: instead of dropping turns, the model loads again with a context that holds the
    whole prompt (up to the trained length, where the memory plan allows it), and no warning is needed. The
    log says that the prompt chose the context, not a num_ctx (the request sent none)."""
    caplog.set_level(logging.INFO, logger="ollama_spec.server")
    with running_store(store_copy, no_draft=True) as (url, _):
        client = ollama.Client(host=url)
        client.generate("tiny-alien", "Once", options={"num_predict": 2})
        history = []
        for turn in range(24):
            history += [
                {"role": "user", "content": f"Tell me more about the river, part {turn}. " * 12},
                {"role": "assistant", "content": "The river ran past the old mill and on to the sea. " * 12},
            ]
        messages = [*history, {"role": "user", "content": "And then?"}]
        answer = client.chat("tiny-alien", messages=messages, options={"num_predict": 4, "temperature": 0})
        loaded = {m.model: m.context_length for m in client.ps().models}["tiny-alien:latest"]
        assert answer.prompt_eval_count > 4096 and loaded > answer.prompt_eval_count
        speculation = answer.model_dump().get("speculation") or {}
        assert not speculation.get("warnings")  # nothing was left out
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith(("loaded tiny-alien", "unloading"))]
    assert "context 8192 for a prompt that needs " in logged[1] and "beyond its 4096" in logged[1], logged
    assert "context 8192 (a prompt that needs " in logged[2] and not any("asked for" in line for line in logged)


def test_an_openai_chat_longer_than_the_loaded_context_loads_the_context_it_needs(store_copy):
    """/v1 never cuts a prompt, and an OpenAI client has no num_ctx to send: a chat past the loaded context
    loads the model again with one that holds it (as on Ollama's routes), and only past the trained
    length is it a 400."""
    with running_store(store_copy, no_draft=True) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused")
        ollama.Client(host=url).generate("tiny-alien", "Once", options={"num_predict": 2})
        history = []
        for turn in range(10):
            history += [
                {"role": "user", "content": f"Tell me more about the river, part {turn}. " * 12},
                {"role": "assistant", "content": "The river ran past the old mill and on to the sea. " * 12},
            ]
        messages = [*history, {"role": "user", "content": "And then?"}]
        answer = client.chat.completions.create(model="tiny-alien", messages=messages, max_tokens=4)
        assert answer.usage.prompt_tokens > 4096
        assert [m.context_length for m in ollama.Client(host=url).ps().models] == [8192]
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(model="tiny-alien", messages=history * 2, max_tokens=4)
        assert refused.value.code == "context_length_exceeded" and "trained context (8192" in refused.value.message
