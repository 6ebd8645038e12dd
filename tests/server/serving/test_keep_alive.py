"""keep_alive as Ollama's api.Duration reads it, the same on every route: a huge one means forever (and /api/ps
says so as Ollama does, never a 500), text without a unit and booleans are refused on /api/embed as on /api/chat."""

import json
import threading
from datetime import datetime, timezone

import pytest

from ollama_spec.errors import InvalidSetting
from ollama_spec.server.serving.keep_alive import FOREVER, parse_keep_alive
from tests.serving import get, post, running_store, serving_tiny_pair

HUGE = 10**400  # float() of it overflows


@pytest.mark.parametrize(
    "value",
    [1e12, HUGE, -HUGE, "-1s", -1, 2**63, "9999999999999h"],
    ids=["1e12", "400 digits", "-400 digits", "-1s", "-1", "2**63", "9999999999999h"],
)
def test_a_huge_or_negative_keep_alive_is_forever(value):
    assert parse_keep_alive(value) == FOREVER
    assert parse_keep_alive(value, bare_seconds=False) == FOREVER


def test_bare_seconds_only_where_ollama_reads_them():
    assert parse_keep_alive("300") == 300  # OLLAMA_KEEP_ALIVE=300, serve --keep-alive 300
    with pytest.raises(InvalidSetting, match='missing unit in duration "300"'):
        parse_keep_alive("300", bare_seconds=False)  # a request's keep_alive: Go's time.ParseDuration
    for bad in (True, float("nan"), [], {}):
        with pytest.raises(InvalidSetting):
            parse_keep_alive(bad, bare_seconds=False)


@pytest.fixture(scope="module")
def pinned(tiny_models):
    with serving_tiny_pair(tiny_models) as served:
        yield served[0]


@pytest.mark.parametrize("route", ["/api/embed", "/api/embeddings", "/api/generate", "/api/chat"])
@pytest.mark.parametrize("keep_alive, words", [("300", "missing unit"), (True, "unsupported type bool")])
def test_every_route_refuses_the_same_keep_alives(pinned, route, keep_alive, words):
    body = {"model": "m", "input": "hi", "prompt": "hi", "keep_alive": keep_alive, "stream": False}
    answer = post(pinned + route, json=body)
    assert answer.status_code == 400, answer.text
    assert words in answer.json()["error"] and "keep_alive" in answer.json()["error"]


def _forever(expires_at: str) -> bool:
    """Ollama's forever: now plus Go's longest duration, about 292 years (its CLI shows "Forever")."""
    when = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    return (when - datetime.now(timezone.utc)).days > 290 * 365


@pytest.mark.parametrize("keep_alive", [b"1e12", str(HUGE).encode(), b"-1"], ids=["1e12", "400 digits", "-1"])
def test_a_huge_keep_alive_is_forever_in_ps_while_running_and_after(tiny_store, keep_alive):
    body = b'{"model": "tiny-target", "prompt": "Once", "stream": false, "options": {"num_predict": 24}, '
    body += b'"keep_alive": ' + keep_alive + b"}"
    with running_store(tiny_store, no_draft=True) as (url, _):
        seen, done = [], threading.Event()

        def watch():  # /api/ps asked while the generation holds the model, as the fault run found it
            while not done.is_set():
                seen.append(get(url + "/api/ps"))

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            answer = post(url + "/api/generate", content=body)
        finally:
            done.set()
            watcher.join()
        assert answer.status_code == 200, answer.text
        after = get(url + "/api/ps")
        for ps in [*seen, after]:
            assert ps.status_code == 200 and ps.headers["content-type"] == "application/json", ps.text
        running = [m for ps in seen for m in ps.json()["models"]]
        assert running and all(_forever(m["expires_at"]) for m in running)
        (model,) = after.json()["models"]
        assert _forever(model["expires_at"]), json.dumps(model)
