"""`ollama-spec ps` and `stop` against a real serve over the tiny store."""

from tests.serving import get, post, running_store


def test_ps_lists_what_serve_holds_and_stop_unloads_it(invoke, tiny_store):
    with running_store(tiny_store, pairs={"tiny-target": "tiny-draft"}) as (url, _):
        body = {"model": "tiny-target", "prompt": "Once", "stream": False, "options": {"num_predict": 2}}
        assert post(url + "/api/generate", json=body).status_code == 200
        shown = invoke("ps", "--host", url)
        assert shown.exit_code == 0, shown.output
        header, row = shown.output.splitlines()
        assert header.split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL", "DRAFT"]
        assert row.startswith("tiny-target:latest") and "100% CPU" in row and "4096" in row
        assert "minutes from now" in row and row.endswith("tiny-draft:latest")
        stopped = invoke("stop", "tiny-target", "--host", url)
        assert stopped.exit_code == 0, stopped.output
        assert get(url + "/api/ps").json() == {"models": []}
        unknown = invoke("stop", "nope", "--host", url)
        assert unknown.exit_code == 1 and unknown.output.strip() == 'Error: couldn\'t find model "nope" to stop'


def test_ps_without_a_server_says_what_to_do(invoke):
    result = invoke("ps", "--host", "127.0.0.1:9")
    assert result.exit_code == 1 and "check that `ollama-spec serve` is running there" in result.output
