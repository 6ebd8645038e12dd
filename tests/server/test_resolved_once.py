"""A cold request is resolved once: for one /api/chat and one /v1/chat/completions to a server over the store,
with nothing loaded, the target's name is read from the store once, the pair is planned once, each model's
usability, the pair's compatibility and the repack choice are decided once, the output grammar is compiled
once and the body is parsed as JSON once. Counted around the real functions, through a live server loading
the tiny synthetic pair."""

import json
import sys
from collections import Counter

import pytest

from ollama_spec.llama import canary, grammar
from ollama_spec.models import compat, usable
from ollama_spec.models.store import Store
from ollama_spec.planning import fit
from tests.conftest import engine_settings
from tests.serving import post, running_store

CHAT = {"messages": [{"role": "user", "content": "Once upon"}], "stream": False}
BODIES = {
    "/api/chat": CHAT | {"model": "tiny-target", "format": "json", "options": {"num_predict": 4, "temperature": 0}},
    "/v1/chat/completions": CHAT
    | {"model": "tiny-target", "response_format": {"type": "json_object"}, "max_tokens": 4, "temperature": 0},
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


@pytest.mark.parametrize("path", list(BODIES))
def test_a_cold_chat_is_resolved_once(tiny_store, monkeypatch, path):
    body = json.dumps(BODIES[path])
    counts: Counter = Counter()
    engine = engine_settings(parallel=1, memory_check=True)
    with running_store(tiny_store, pairs={"tiny-target": "tiny-draft"}, engine=engine) as (url, _):
        resolve, loads = Store.resolve, json.loads

        def store_read(self, name, *args, **kwargs):
            if name.lower().startswith("tiny-target"):
                counts["store read of the target"] += 1
            return resolve(self, name, *args, **kwargs)

        def parsed(text, *args, **kwargs):
            if (text.decode() if isinstance(text, bytes | bytearray) else text) == body:
                counts["JSON parse of the body"] += 1
            return loads(text, *args, **kwargs)

        monkeypatch.setattr(Store, "resolve", store_read)
        monkeypatch.setattr(json, "loads", parsed)
        count_calls(monkeypatch, usable.require_usable, counts, lambda args: f"usable as {args[2]}")
        count_calls(monkeypatch, compat.require_compatible, counts, lambda args: "compatibility")
        count_calls(monkeypatch, canary.decide_repack, counts, lambda args: "repack decision")
        count_calls(monkeypatch, fit.fit_pair, counts, lambda args: "memory plan")
        count_calls(monkeypatch, grammar.new_grammar_sampler, counts, lambda args: "grammar compile")
        response = post(url + path, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 200, response.text
    assert counts == {
        "store read of the target": 1,
        "memory plan": 1,
        "usable as target": 1,
        "usable as draft": 1,
        "compatibility": 1,
        "repack decision": 1,
        "grammar compile": 1,
        "JSON parse of the body": 1,
    }
