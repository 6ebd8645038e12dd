"""The speculation summary names who drafted (server/serving/speculation.py): a target's own MTP layers as "mtp",
by --pair or by default; `mtp` paired with a target without them is a 400 that says why."""

from tests.builders.mtp import build_mtp_target
from tests.serving import post, running_store


def ask(url, model):
    body = {"model": model, "prompt": "Once", "stream": False, "options": {"num_predict": 6, "temperature": 0}}
    return post(url + "/api/generate", json=body)


def test_the_mtp_layers_draft_as_mtp_and_a_target_without_them_is_refused(store_copy):
    build_mtp_target(store_copy)
    with running_store(store_copy, pairs={"tiny-target": "mtp", "mtp-target": "mtp"}) as (url, _):
        answer = ask(url, "mtp-target")
        assert answer.status_code == 200, answer.text
        speculation = answer.json()["speculation"]
        assert speculation["draft"] == "mtp" and "own MTP (NextN) layers" in speculation["draft_reason"]
        refused = ask(url, "tiny-target")
        assert refused.status_code == 400
        assert refused.json()["error"].startswith("--pair tiny-target:latest=mtp: tiny-target:latest has no MTP")
