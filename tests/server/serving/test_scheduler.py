"""serve without a TARGET: the store's models loaded on demand, kept for their keep_alive, evicted when a new
one does not fit, as Ollama's scheduler does. A real server over the tiny synthetic store."""

import time

from tests.builders.writers import write_lora_gguf
from tests.serving import get, post, running_store
from tests.stores import variant


def ask(url, model, **fields):
    body = {"model": model, "prompt": "Once", "stream": False, "options": {"num_predict": 3, "temperature": 0}}
    return post(url + "/api/generate", json=body | fields)


def loaded(url):
    return {m["name"]: m for m in get(url + "/api/ps").json()["models"]}


def eventually_unloaded(url, seconds=10):
    """/api/ps once nothing is loaded, or what it still lists after `seconds`."""
    deadline = time.monotonic() + seconds
    while loaded(url) and time.monotonic() < deadline:
        time.sleep(0.1)
    return loaded(url)


def test_two_models_load_on_demand_and_both_answer(tiny_store):
    with running_store(tiny_store, pairs={"tiny-target": "tiny-draft"}) as (url, _):
        assert loaded(url) == {}
        names = [m["name"] for m in get(url + "/api/tags").json()["models"]]
        assert "tiny-target:latest" in names and "tiny-draft:q8_0" in names
        assert [m["id"] for m in get(url + "/v1/models").json()["data"]] == names
        first = ask(url, "tiny-target")
        assert first.status_code == 200, first.text
        assert first.json()["speculation"]["draft"] == "tiny-draft:latest"
        assert "--pair" in first.json()["speculation"]["draft_reason"]
        second = ask(url, "TINY-TARGET:q8_0")  # Ollama's case-insensitive names
        assert second.status_code == 200, second.text
        running = loaded(url)
        assert set(running) == {"tiny-target:latest", "tiny-target:q8_0"}
        assert running["tiny-target:latest"]["draft"]["model"] == "tiny-draft:latest"
        assert running["tiny-target:q8_0"]["draft"]["reason"].startswith("the store's best compatible draft")
        assert running["tiny-target:latest"]["context_length"] == 4096  # Ollama's default on a CPU
        shown = post(url + "/api/show", json={"model": "tiny-target:q4_0"}).json()  # shown, not loaded
        assert shown["speculation"]["draft_reason"] and "tiny-target:q4_0" not in loaded(url)


def test_keep_alive_zero_unloads_and_ps_says_so(tiny_store):
    with running_store(tiny_store, no_draft=True) as (url, _):
        assert ask(url, "tiny-target").status_code == 200
        assert "tiny-target:latest" in loaded(url)
        stop = post(url + "/api/generate", json={"model": "tiny-target", "keep_alive": 0})
        assert stop.json()["done_reason"] == "unload"
        assert loaded(url) == {}
        # a generation with keep_alive 0 unloads once it is answered
        assert ask(url, "tiny-target", keep_alive=0).status_code == 200
        assert eventually_unloaded(url, 5) == {}  # unloaded just after the answer, as Ollama does


def test_an_expired_keep_alive_unloads(tiny_store):
    with running_store(tiny_store, no_draft=True) as (url, _):
        assert ask(url, "tiny-target", keep_alive="1s").status_code == 200
        expires = loaded(url)["tiny-target:latest"]["expires_at"]
        assert expires.startswith("20") and not expires.startswith("2099")
        assert eventually_unloaded(url) == {}


def test_the_least_recently_used_idle_model_makes_room(tiny_store):
    from ollama_spec.planning.devices import system_ram
    from ollama_spec.server.serving.pairs import StorePairs
    from ollama_spec.server.serving.scheduler import SchedulerSettings
    from tests.conftest import engine_settings

    engine = engine_settings(parallel=1, memory_check=True)
    store = StorePairs(models_dir=str(tiny_store), no_draft=True, engine=engine)
    names = ["tiny-target", "tiny-target:q8_0", "tiny-target:q4_0"]
    need = [store.plan(name, [system_ram(64)]).plan.host_bytes for name in names]
    budget = need[0] + need[1] + need[2] // 2  # two fit, not three
    settings = SchedulerSettings(memory_budget=budget)
    with running_store(tiny_store, settings, no_draft=True, engine=engine) as (url, _):
        for name in names[:2]:
            assert ask(url, name).status_code == 200
        assert ask(url, names[2]).status_code == 200
        assert set(loaded(url)) == {"tiny-target:q8_0", "tiny-target:q4_0"}  # the first, least recent, went


def test_a_model_that_cannot_fit_at_all_is_refused_in_the_plans_words(tiny_store):
    from ollama_spec.server.serving.scheduler import SchedulerSettings
    from tests.conftest import engine_settings

    engine = engine_settings(parallel=1, memory_check=True)
    with running_store(tiny_store, SchedulerSettings(memory_budget=1 << 16), no_draft=True, engine=engine) as (url, _):
        answer = ask(url, "tiny-target")
        assert answer.status_code == 500 and "does not fit" in answer.json()["error"]


def test_an_unknown_model_is_ollamas_404_on_both_apis(tiny_store):
    with running_store(tiny_store) as (url, _):
        answer = ask(url, "nope")
        assert answer.status_code == 404
        assert answer.json() == {"error": 'model "nope" not found, try pulling it first'}
        chat = post(
            url + "/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "Hi"}]}
        )
        assert chat.status_code == 404 and chat.json()["error"]["message"].startswith('model "nope" not found')
        assert get(url + "/v1/models/nope").status_code == 404


def add_adapter_only(store, tmp_path, name: str = "adapter-only") -> None:
    """A model whose GGUF is a LoRA adapter (no vocabulary): in the store, but nothing llama.cpp can run."""
    from ollama_spec.synthetic.catalog import PAIRS

    arch = PAIRS["tiny"].arch
    write_lora_gguf(tmp_path / "lora.gguf", arch=arch, n_layer=arch.n_layer)
    variant(
        store,
        name,
        keep=lambda layer: not layer["mediaType"].endswith(".model"),
        extra=[("model", (tmp_path / "lora.gguf").read_bytes())],
    )


def test_a_model_that_cannot_run_is_a_400_and_the_rest_still_serve(store_copy, tmp_path):
    add_adapter_only(store_copy, tmp_path)
    with running_store(store_copy, no_draft=True) as (url, _):
        assert "adapter-only:latest" not in [m["name"] for m in get(url + "/api/tags").json()["models"]]
        answer = ask(url, "adapter-only")
        assert answer.status_code == 400 and "cannot be the target" in answer.json()["error"]
        assert "\n" not in answer.json()["error"]
        assert ask(url, "tiny-target").status_code == 200
