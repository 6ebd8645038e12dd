"""`ollama-spec pull` through a daemon speaking Ollama's `/api/pull` NDJSON protocol on 127.0.0.1."""

from __future__ import annotations

import json

import pytest

from ollama_spec.models.names import parse_model_name
from ollama_spec.pull import PullSettings, choose_via
from tests.pull_servers import Daemon, closed_port

DIGEST = "sha256:" + "ab" * 32
PROGRESS = [
    {"status": "pulling manifest"},
    {"status": "pulling abababababab", "digest": DIGEST, "total": 2000, "completed": 0},
    {"status": "pulling abababababab", "digest": DIGEST, "total": 2000, "completed": 1000},
    {"status": "pulling abababababab", "digest": DIGEST, "total": 2000, "completed": 2000},
    {"status": "verifying sha256 digest"},
    {"status": "writing manifest"},
    {"status": "success"},
]


@pytest.fixture
def daemon(monkeypatch):
    servers = []

    def start(lines, status=200):
        server = Daemon(lines, status)
        servers.append(server)
        monkeypatch.setenv("OLLAMA_HOST", server.url)
        return server

    yield start
    for server in servers:
        server.close()


def test_a_running_daemon_is_used_and_its_progress_passed_through(invoke, daemon):
    server = daemon(PROGRESS)
    result = invoke("pull", "llama3.2:1b", "qwen2.5:0.5b", "--json")
    assert result.exit_code == 0, result.output
    assert [body["model"] for body in server.bodies] == ["llama3.2:1b", "qwen2.5:0.5b"]
    assert all(body["stream"] is True for body in server.bodies)
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert rows[0] == {"model": "llama3.2:1b", "status": "pulling manifest"}
    assert {
        "model": "llama3.2:1b",
        "status": "pulling abababababab",
        "digest": DIGEST,
        "total": 2000,
        "completed": 2000,
    } in rows
    assert rows[-1] == {"model": "qwen2.5:0.5b", "status": "success"}


def test_plain_output_names_the_path(invoke, daemon):
    daemon(PROGRESS)
    result = invoke("pull", "llama3.2:1b")
    assert result.exit_code == 0, result.output
    assert "llama3.2:1b: pulling abababababab (2.0 KiB)" in result.output
    assert "pulled llama3.2:1b (via ollama)" in result.output


@pytest.mark.parametrize(
    ("lines", "status", "message"),
    [
        (
            [{"status": "pulling manifest"}, {"error": "pull model manifest: file does not exist"}],
            200,
            "says: pull model manifest: file does not exist",
        ),
        ([{"error": "invalid model name"}], 400, "says: invalid model name"),
        (
            [{"status": "pulling manifest"}],
            200,
            "ended the pull of llama3.2:1b without success (last status: 'pulling manifest')",
        ),
    ],
)
def test_daemon_errors_are_passed_through(invoke, daemon, lines, status, message):
    server = daemon(lines, status)
    result = invoke("pull", "llama3.2:1b")
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == f"Error: the Ollama daemon at {server.url} {message}"


def test_forced_daemon_that_does_not_answer(invoke, monkeypatch):
    monkeypatch.setenv("OLLAMA_HOST", f"http://127.0.0.1:{closed_port()}")
    result = invoke("pull", "llama3.2:1b", "--via", "ollama")
    assert result.exit_code == 1
    assert "cannot reach the Ollama daemon at http://127.0.0.1:" in result.output


def test_models_dir_writes_there_rather_than_asking_the_daemon(invoke, daemon, tmp_path):
    server = daemon(PROGRESS)
    port = closed_port()
    result = invoke("pull", f"127.0.0.1:{port}/library/m:latest", "--insecure", "--models-dir", tmp_path)
    assert result.exit_code == 1 and f"cannot reach the registry at http://127.0.0.1:{port}" in result.output
    assert server.bodies == []


def test_choose_via(monkeypatch):
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    ref, hf = parse_model_name("llama3.2:1b"), parse_model_name("hf.co/u/r:Q8_0")
    assert choose_via(ref, PullSettings(), lambda: True) == "ollama"
    assert choose_via(ref, PullSettings(), lambda: False) == "registry"
    # hf.co speaks Ollama's registry protocol, template and params included, as `ollama pull` reads it
    assert choose_via(hf, PullSettings(), lambda: False) == "registry"
    assert choose_via(hf, PullSettings(via="registry"), lambda: True) == "registry"
    assert choose_via(hf, PullSettings(via="hf"), lambda: True) == "hf"
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:1")  # a Hub mirror speaks only the Hub's API
    assert choose_via(hf, PullSettings(), lambda: False) == "hf"


class SpecServer(Daemon):
    """ollama-spec's own server as OLLAMA_HOST: it names itself in /api/version, and its /api/pull
    answers success for any name without downloading anything."""

    def handle(self, handler, method):
        if handler.path == "/api/version":
            return self.send_json(handler, 200, {"version": "0.12.0", "ollama_spec": "1.0"})
        return super().handle(handler, method)


def test_ollama_spec_server_at_ollama_host_is_not_taken_for_the_daemon(invoke, monkeypatch, tmp_path):
    server = SpecServer([{"status": "success"}])
    try:
        monkeypatch.setenv("OLLAMA_HOST", server.url)
        port = closed_port()
        result = invoke("pull", f"127.0.0.1:{port}/library/m:latest", "--insecure")
        assert result.exit_code == 1, result.output
        assert "is an ollama-spec server, not the Ollama daemon: pulling straight from the registry" in result.output
        assert f"cannot reach the registry at http://127.0.0.1:{port}" in result.output
        assert server.bodies == []  # never asked to "pull"
        forced = invoke("pull", "llama3.2:1b", "--via", "ollama")
        assert forced.exit_code == 1
        assert "is an ollama-spec server, not the Ollama daemon: it cannot pull models" in forced.output
        assert server.bodies == []
    finally:
        server.close()


def test_via_ollama_with_models_dir_is_refused(invoke, tmp_path):
    result = invoke("pull", "llama3.2:1b", "--via", "ollama", "--models-dir", tmp_path)
    assert result.exit_code != 0
    assert result.output.splitlines()[-1] == (
        "Error: --via ollama writes into the daemon's own store, not --models-dir: drop one of the two"
    )


def test_a_daemon_storing_outside_ollama_models_is_reported(invoke, daemon, tmp_path, monkeypatch):
    daemon(PROGRESS)
    (tmp_path / "manifests").mkdir()
    (tmp_path / "blobs").mkdir()
    monkeypatch.setenv("OLLAMA_MODELS", str(tmp_path))
    result = invoke("pull", "llama3.2:1b")
    assert result.exit_code == 0, result.output
    assert "stored it outside OLLAMA_MODELS=" in result.output


def test_ollama_host_is_trimmed_of_spaces_and_quotes_as_ollama_does(monkeypatch):
    monkeypatch.setenv("OLLAMA_HOST", ' "http://10.0.0.5:11434" ')
    assert PullSettings().daemon_host == "http://10.0.0.5:11434"
    assert PullSettings(ollama_host="http://other:1").daemon_host == "http://other:1"
