"""The scheduler as the one owner of load, evict, unload and delete: a delete waits for a load in progress and
for the running requests of the model, a copy over a loaded name is loaded again, and nothing is closed under
a request. Real engines over a copy of the tiny store, driven on one event loop (and over HTTP)."""

from __future__ import annotations

import asyncio
import threading

import ollama

from ollama_spec.pull.edits import delete_model
from ollama_spec.server.metrics import Metrics
from ollama_spec.server.pairs import StorePairs
from ollama_spec.server.scheduler import Scheduler, SchedulerSettings
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
        assert getattr(refused[0], "status", None) == 404
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
        loading = asyncio.ensure_future(owner.acquire("tiny-alien", None))
        while not owner._loading:  # the load has started: it holds the scheduler
            await asyncio.sleep(0.01)
        deleting = asyncio.ensure_future(owner.delete("tiny-alien", lambda key: delete_model(key, str(store_copy))))
        got = (await asyncio.gather(loading, return_exceptions=True))[0]
        if isinstance(got, Exception):  # the delete took the pair before the request resumed: 404, as after it
            assert getattr(got, "status", None) == 404, got
        else:
            await owner.release(got)
        await asyncio.wait_for(deleting, 60)
        assert isinstance(got, Exception) or got.closed
        assert owner.loaded == {} and owner._retiring == []
        assert not store_copy.joinpath(*LIBRARY, "tiny-alien", "latest").exists()
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
