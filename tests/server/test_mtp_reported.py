"""What the server says of a target's own MTP layers chosen by default (engine/mtp_default.py): before it loads,
the default and that it is priced as it loads; once loaded, what was really loaded: the layers where they pay,
the target alone, and why, where they were let go. /api/show, /api/ps and every answer's `speculation` agree.
The step costs are set here, both ways, so the verdict does not depend on this machine's speed."""

import ollama
import pytest

from ollama_spec.decoding.step_costs import StepCosts
from ollama_spec.engine.costs import LearnedCosts
from tests.serving import get, post, running_store

TARGET_STEP = 0.010
CHEAP = StepCosts(0.0005, tuple(TARGET_STEP * (1 + 0.02 * n) for n in range(17)))  # a GPU's NextN layer
DEAR = StepCosts(0.008, tuple(TARGET_STEP * (1 + 0.5 * n) for n in range(17)))  # a draft step near a target's
DEFAULT = "its own MTP (NextN) layers (1) by default, kept as it loads where they fit and pay"
LET_GO = "the target alone: its MTP layers would not pay on this machine (a draft step costs 8.00 ms beside"


def show(url):
    answer = post(url + "/api/show", json={"model": "mtp-target"})
    assert answer.status_code == 200, answer.text
    return answer.json()["speculation"]


def generate(url):
    body = {"model": "mtp-target", "prompt": "Once", "stream": False, "options": {"num_predict": 6, "temperature": 0}}
    answer = post(url + "/api/generate", json=body)
    assert answer.status_code == 200, answer.text
    return answer.json()["speculation"]


def running(url):
    (model,) = get(url + "/api/ps").json()["models"]
    return model["draft"]


@pytest.mark.parametrize(
    ("costs", "draft", "why", "k"),
    [(CHEAP, "mtp", DEFAULT, None), (DEAR, None, LET_GO, 0)],
    ids=["kept", "let-go"],
)
def test_the_server_says_what_was_loaded_not_what_was_planned(mtp_store, monkeypatch, costs, draft, why, k):
    monkeypatch.setattr(LearnedCosts, "calibrated", lambda self, drafter, k_max: costs)
    with running_store(mtp_store) as (url, _):
        assert show(url) == {"draft": "mtp", "draft_reason": DEFAULT, "num_speculative_tokens": None, "loaded": False}
        assert ollama.Client(host=url).show("mtp-target").details.family == "glm4moe"
        answered = generate(url)
        assert answered["draft"] == draft and answered["draft_reason"].startswith(why)
        assert (answered["drafted_tokens"] > 0) == (draft is not None)
        shown = show(url)
        assert (shown["draft"], shown["num_speculative_tokens"], shown["loaded"]) == (draft, k, True)
        assert shown["draft_reason"] == answered["draft_reason"]
        assert running(url) == {"model": draft, "reason": answered["draft_reason"]}
        client = ollama.Client(host=url)  # Ollama's own client reads both answers as before
        assert client.show("mtp-target").details.family == "glm4moe"
        assert [m.model for m in client.ps().models] == ["mtp-target:latest"]


def test_a_pinned_target_whose_default_mtp_layers_were_let_go_says_so(mtp_store, monkeypatch):
    from ollama_spec.engine.engine import Engine
    from ollama_spec.models.resolve import resolve_model
    from tests.conftest import engine_settings
    from tests.serving import running_server

    monkeypatch.setattr(LearnedCosts, "calibrated", lambda self, drafter, k_max: DEAR)
    target = resolve_model("mtp-target", str(mtp_store))
    with Engine(target, None, engine_settings(mtp=True, mtp_where_it_pays=True)) as engine:
        with running_server(engine) as (url, _):  # serve mtp-target: the pair is loaded before it listens
            shown = show(url)
            assert (shown["draft"], shown["loaded"], shown["num_speculative_tokens"]) == (None, True, 0)
            assert shown["draft_reason"].startswith(LET_GO) and running(url)["reason"] == shown["draft_reason"]
