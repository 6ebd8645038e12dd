"""The server core under the race #40 names: 8 clients alternating 3 models with room for one, while another
client copies, chats with and deletes a model; once with --max-loaded 1, once with a memory budget that holds
only one model. Every answer is a 200 or a 503 with Retry-After, never a 500, and the store loses nothing
(the store check runs after the test)."""

from __future__ import annotations

import threading

import httpx
import pytest

from ollama_spec.server.serving.pairs import StorePairs
from ollama_spec.server.serving.scheduler import SchedulerSettings
from tests.conftest import engine_settings
from tests.serving import running_store

MODELS = ("tiny-target", "tiny-target:q8_0", "tiny-alien")
GENERATE = {"prompt": "Once", "stream": False, "options": {"num_predict": 4, "temperature": 0}}


def room_for_one(store) -> tuple[SchedulerSettings, dict]:
    from ollama_spec.planning.devices import system_ram

    engine = engine_settings(parallel=1, memory_check=True)
    pairs = StorePairs(models_dir=str(store), no_draft=True, engine=engine)
    need = sorted(pairs.plan(name, [system_ram(64)]).plan.host_bytes for name in MODELS)
    return SchedulerSettings(memory_budget=need[-1] + need[0] // 2, load_timeout=60), {"engine": engine}


@pytest.mark.parametrize("limit", ["max-loaded", "memory"])
def test_clients_alternating_models_and_a_copier_deleting_get_200_or_503(store_copy, limit):
    if limit == "max-loaded":
        settings, pairs = SchedulerSettings(max_loaded=1, load_timeout=60), {}
    else:
        settings, pairs = room_for_one(store_copy)
    answers: list[tuple[str, int, httpx.Headers]] = []
    lock = threading.Lock()

    with running_store(store_copy, settings, max_queue=16, no_draft=True, **pairs) as (url, _):
        client = httpx.Client(base_url=url, timeout=120)

        def ask(label: str, method: str, path: str, body: dict) -> int:
            answer = client.request(method, path, json=body)
            with lock:
                answers.append((label, answer.status_code, answer.headers))
            return answer.status_code

        def alternating(i: int) -> None:
            for turn in range(4):
                ask("client", "POST", "/api/generate", {"model": MODELS[(i + turn) % 3]} | GENERATE)

        def copier() -> None:
            for round_ in range(2):
                name = f"mine/copy:r{round_}"
                ask("copy", "POST", "/api/copy", {"source": "tiny-target", "destination": name})
                ask("chat", "POST", "/api/generate", {"model": name} | GENERATE)
                ask("delete", "DELETE", "/api/delete", {"model": name})

        threads = [threading.Thread(target=alternating, args=(i,)) for i in range(8)]
        threads.append(threading.Thread(target=copier))
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert not any(thread.is_alive() for thread in threads)
        listed = [m["name"] for m in client.get("/api/tags").json()["models"]]
        client.close()

    assert len(answers) == 8 * 4 + 2 * 3
    assert {status for _, status, _ in answers} <= {200, 503}, [(label, status) for label, status, _ in answers]
    assert all("retry-after" in headers for _, status, headers in answers if status == 503)
    assert sum(status == 200 for label, status, _ in answers if label == "client") >= 16
    assert [status for label, status, _ in answers if label in ("copy", "delete")] == [200] * 4
    assert not any(name.startswith("mine/copy") for name in listed)
