"""`bench --concurrency N` without --url: the tiny pair served in this process, timed over HTTP, stopped after."""

import re
import socket
import threading

import pytest

from ollama_spec.cli.bench_server import served_k
from ollama_spec.errors import InvalidSetting

# One short prompt, one run, K fixed (no calibration): seconds, not minutes, on a shared 2-core machine.
FAST = ("--no-check", "--threads", "1", "--max-tokens", "6", "--runs", "1", "-k", "2", "--no-warmup")


@pytest.fixture(scope="module")
def one_prompt(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text('{"name": "fox", "prompt": "The quick brown fox"}\n', encoding="utf-8")
    return path


def served(invoke, store, prompts, *args):
    return invoke("bench", "tiny-target", "-d", "tiny-draft", "--models-dir", store, *FAST, "--prompts", prompts, *args)


def assert_stopped(port: int) -> None:
    assert not [t for t in threading.enumerate() if t.name == "bench-server"]
    with socket.socket() as sock:  # without SO_REUSEADDR: a port still listening (or half closed) refuses this
        sock.bind(("127.0.0.1", port))


def test_two_clients_time_the_served_pair_and_the_server_stops(invoke, tiny_store, one_prompt, tmp_path):
    out = tmp_path / "results"
    result = served(invoke, tiny_store, one_prompt, "--concurrency", "2", "--out", out)
    assert result.exit_code == 0, result.output
    served_at = re.search(
        r"tiny-target:latest at http://127\.0\.0\.1:(\d+)/v1: median [\d.]+ tok/s a request", result.output
    )
    assert "drafted by tiny-draft:latest (K=2, 2 slots) in this process at http://127.0.0.1:" in result.output
    line = next(line for line in result.output.splitlines() if line.startswith("2 clients at once: "))
    assert re.fullmatch(
        r"2 clients at once: [\d.]+ tok/s in all, [\d.]+ tok/s a request, latency p50 [\d.]+ s, p95 [\d.]+ s, "
        r"time to first token \d+ ms",
        line,
    )
    assert (out / "results.json").exists() and not (out / "bench.png").exists()  # the --url report, not the rows'
    assert "speculative K=" not in result.output  # the rows were not timed
    assert_stopped(int(served_at[1]))


def test_ctrl_c_mid_bench_stops_the_server(invoke, tiny_store, one_prompt, monkeypatch):
    from ollama_spec.bench import remote

    seen = []

    def interrupted(settings, prompts, progress):
        seen.append(int(settings.url.rsplit(":", 1)[1].removesuffix("/v1")))
        assert remote.httpx.get(settings.url.removesuffix("/v1") + "/health").json()["status"] == "ok"
        raise KeyboardInterrupt

    monkeypatch.setattr(remote, "run_remote", interrupted)
    result = served(invoke, tiny_store, one_prompt, "--concurrency", "2")
    assert result.exit_code == 130 and "Interrupted." in result.output
    assert_stopped(seen[0])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("-k", "1,3"), "Error: -k '1,3': a server drafts at one K, so with --concurrency give -k one number or auto"),
        (
            ("--native", "llama-speculative-simple"),
            "Error: --concurrency times the pair as a server runs it, at one K, so --native would be ignored: drop it",
        ),
        (
            ("--no-ngram",),
            "Error: --concurrency times the pair as a server runs it, at one K, so --ngram would be ignored: drop it",
        ),
    ],
)
def test_options_of_the_rows_are_one_line_before_any_load(invoke, tiny_store, one_prompt, monkeypatch, args, message):
    from ollama_spec.cli import bench_server

    monkeypatch.setattr(bench_server, "Engine", None)  # loading would fail loudly
    result = served(invoke, tiny_store, one_prompt, "--concurrency", "2", *args)
    assert result.exit_code == 1
    assert result.output.strip() == message


def test_a_memory_refusal_names_the_bench_flag(invoke, tiny_store, one_prompt, monkeypatch):
    from ollama_spec.cli import bench_server
    from ollama_spec.errors import InsufficientMemory

    def refused(*args, **kwargs):
        raise InsufficientMemory("8 slots do not fit in RAM; try: --parallel 2 fits in RAM")

    monkeypatch.setattr(bench_server, "Engine", refused)
    result = served(invoke, tiny_store, one_prompt, "--concurrency", "8")
    assert result.exit_code == 1
    assert result.output.strip() == "Error: 8 slots do not fit in RAM; try: --concurrency 2 fits in RAM"


def test_concurrency_below_one_is_a_usage_error(invoke, tiny_store):
    result = invoke("bench", "tiny-target", "-d", "tiny-draft", "--models-dir", tiny_store, "--concurrency", "0")
    assert result.exit_code == 2
    assert result.output.splitlines()[-1] == "Error: Invalid value for '--concurrency': 0 is not in the range x>=1."


def test_served_k_is_one_value_else_the_models_then_auto():
    assert served_k("3", {}) == 3
    assert served_k("auto", {"draft_num_predict": 4}) is None  # given: the flag wins
    assert served_k(None, {"draft_num_predict": 4}) == 4  # as serve: the model's own speculation length
    assert served_k(None, {}) is None
    with pytest.raises(InvalidSetting, match="one number or auto"):
        served_k("auto,2", {})
