"""A cold request is resolved once: for one /api/chat and one /v1/chat/completions to a server over the store,
with nothing loaded (in front of an upstream daemon too), the target's name is read from the store once, the
pair is planned once, each model's usability, the pair's compatibility and the repack choice are decided once,
the output grammar is compiled once, the body is parsed as JSON once and the route table matched once. A reload
for a larger context plans only the fit again; /api/show reads the name once; the prompts of one
/v1/completions share one grammar. Counted around the real functions, through a live server loading the tiny
synthetic pair."""

import json
import sys
from collections import Counter
from contextlib import contextmanager

import pytest
from fastapi.routing import APIRoute
from starlette.routing import Match

from ollama_spec.engine import pairing
from ollama_spec.llama import canary, grammar
from ollama_spec.models import compat, usable
from ollama_spec.models.store import Store
from ollama_spec.planning import fit
from tests.conftest import engine_settings
from tests.serving import post, running_store
from tests.upstream_daemon import UpstreamDaemon

CHAT = {"messages": [{"role": "user", "content": "Once upon"}], "stream": False}
BODIES = {
    "/api/chat": CHAT | {"model": "tiny-target", "format": "json", "options": {"num_predict": 4, "temperature": 0}},
    "/v1/chat/completions": CHAT
    | {"model": "tiny-target", "response_format": {"type": "json_object"}, "max_tokens": 4, "temperature": 0},
}
ONCE = {
    "store read of the target": 1,
    "memory plan": 1,
    "draft choice": 1,
    "usable as target": 1,
    "usable as draft": 1,
    "compatibility": 1,
    "repack decision": 1,
    "grammar compile": 1,
    "JSON parse of the body": 1,
    "route table match": 1,
}


def count_calls(monkeypatch, function, counts: Counter, label) -> None:
    """Count each call of `function` under `label(args)` (None: not counted), wherever a loaded module
    holds it by name."""

    def counted(*args, **kwargs):
        if (key := label(args)) is not None:
            counts[key] += 1
        return function(*args, **kwargs)

    for module in [m for m in list(sys.modules.values()) if m is not None]:
        for attr, value in list(vars(module).items()):
            if value is function:
                monkeypatch.setattr(module, attr, counted)


def count_everything(monkeypatch, body: str) -> Counter:
    """From now on, count each decision of ONCE as it is made (`body`: the request body whose parses count)."""
    counts: Counter = Counter()
    resolve, loads, matches = Store.resolve, json.loads, APIRoute.matches

    def store_read(self, name, *args, **kwargs):
        if name.lower().startswith("tiny-target"):
            counts["store read of the target"] += 1
        return resolve(self, name, *args, **kwargs)

    def parsed(text, *args, **kwargs):
        if (text.decode() if isinstance(text, bytes | bytearray) else text) == body:
            counts["JSON parse of the body"] += 1
        return loads(text, *args, **kwargs)

    def matched(self, scope):
        match, child = matches(self, scope)
        counts["route table match"] += match is Match.FULL
        return match, child

    monkeypatch.setattr(Store, "resolve", store_read)
    monkeypatch.setattr(json, "loads", parsed)
    monkeypatch.setattr(APIRoute, "matches", matched)
    count_calls(monkeypatch, usable.require_usable, counts, lambda args: f"usable as {args[2]}")
    count_calls(monkeypatch, compat.require_compatible, counts, lambda args: "compatibility")
    count_calls(monkeypatch, canary.decide_repack, counts, lambda args: "repack decision")
    count_calls(monkeypatch, fit.fit_pair, counts, lambda args: "memory plan")
    count_calls(monkeypatch, pairing.choose_draft, counts, lambda args: "draft choice")
    count_calls(monkeypatch, grammar.new_grammar_sampler, counts, lambda args: "grammar compile")
    return counts


@contextmanager
def serving(tiny_store, upstream: bool):
    """The tiny store served with its pair, nothing loaded (`upstream`: in front of a stand-in daemon)."""
    daemon = UpstreamDaemon(tags=["qwen3:8b"]) if upstream else None
    engine = engine_settings(parallel=1, memory_check=True)
    try:
        with running_store(
            tiny_store, upstream=daemon.url if daemon else None, pairs={"tiny-target": "tiny-draft"}, engine=engine
        ) as (url, state):
            yield url, state
    finally:
        if daemon is not None:
            daemon.close()


@pytest.mark.parametrize("upstream", [False, True], ids=["alone", "upstream"])
@pytest.mark.parametrize("path", list(BODIES))
def test_a_cold_chat_is_resolved_once(tiny_store, monkeypatch, path, upstream):
    body = json.dumps(BODIES[path])
    with serving(tiny_store, upstream) as (url, _):
        counts = count_everything(monkeypatch, body)
        response = post(url + path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    assert counts == ONCE


@pytest.mark.parametrize("upstream", [False, True], ids=["alone", "upstream"])
def test_show_reads_the_name_once(tiny_store, monkeypatch, upstream):
    body = json.dumps({"model": "tiny-target"})
    with serving(tiny_store, upstream) as (url, _):
        counts = count_everything(monkeypatch, body)
        response = post(url + "/api/show", content=body)
    assert response.status_code == 200, response.text
    assert counts["store read of the target"] == 1 and counts["route table match"] == 1


def test_a_reload_for_a_larger_context_plans_only_the_fit_again(tiny_store, monkeypatch):
    """A chat longer than the context the model loads with (4096 by default) loads it again with one that holds
    it (8192, its trained length): the store read, the draft, the checks, the repack choice and the grammar
    of the first load stand; only the fit is planned again."""
    turns = [{"role": "user", "content": f"Tell me more about the river, part {n}. " * 12} for n in range(24)]
    chat = BODIES["/api/chat"] | {"messages": [*turns, {"role": "user", "content": "And then?"}]}
    body = json.dumps(chat | {"options": {"num_predict": 2, "temperature": 0}})
    with serving(tiny_store, upstream=False) as (url, _):
        counts = count_everything(monkeypatch, body)
        response = post(url + "/api/chat", content=body)
    assert response.status_code == 200, response.text
    assert response.json()["prompt_eval_count"] > 4096
    assert counts == ONCE | {"memory plan": 2}


def test_the_prompts_of_one_completion_share_one_grammar(tiny_store, monkeypatch):
    body = json.dumps(
        {"model": "tiny-target", "prompt": ["Once", "upon", "a time"], "max_tokens": 2, "temperature": 0}
        | {"response_format": {"type": "json_object"}}
    )
    with serving(tiny_store, upstream=False) as (url, _):
        counts = count_everything(monkeypatch, body)
        response = post(url + "/v1/completions", content=body)
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == 3
    assert counts == ONCE
