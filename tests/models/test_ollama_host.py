"""OLLAMA_HOST has one reader: `serve`'s upstream, `pull`, `check`/`doctor`'s daemon probe and `ps`/`stop`
all reach the same URL for the same value, as Ollama's envconfig.Host() reads it."""

import pytest

from ollama_spec.cli.running import _client
from ollama_spec.models.daemon import daemon_status, ollama_host
from ollama_spec.pull.settings import PullSettings
from ollama_spec.server.http import upstream
from tests.pull_servers import closed_port

PORT = closed_port()  # nothing answers: each user says where it looked


@pytest.mark.parametrize(
    ("value", "url"),
    [
        (None, "http://127.0.0.1:11434"),
        (f"127.0.0.1:{PORT}", f"http://127.0.0.1:{PORT}"),
        (f":{PORT}", f"http://127.0.0.1:{PORT}"),
        (f"0.0.0.0:{PORT}", f"http://0.0.0.0:{PORT}"),
        (f" '127.0.0.1:{PORT}' ", f"http://127.0.0.1:{PORT}"),
        (f"http://localhost:{PORT}", f"http://localhost:{PORT}"),
        (f"[::1]:{PORT}", f"http://[::1]:{PORT}"),
        ("127.0.0.1:notaport", "http://127.0.0.1:11434"),  # the port is Ollama's default, as Go's reads it
    ],
)
def test_the_same_ollama_host_is_the_same_url_for_every_user(value, url, monkeypatch):
    environ = {} if value is None else {"OLLAMA_HOST": value}
    if value is not None:
        monkeypatch.setenv("OLLAMA_HOST", value)
    probed = []
    monkeypatch.setattr(upstream, "probe_daemon", lambda at: probed.append(at))
    upstream.default_upstream("127.0.0.1", 1, environ)
    assert ollama_host(environ=environ) == url
    assert probed == [url]  # serve --upstream's default
    assert PullSettings().daemon_host == url  # pull
    assert daemon_status().host == url  # check, doctor
    assert str(_client(None).base_url).rstrip("/") == url  # ps, stop


def test_a_given_host_is_read_as_ollama_host_is():
    assert ollama_host(f":{PORT}", environ={"OLLAMA_HOST": "elsewhere:1"}) == f"http://127.0.0.1:{PORT}"
    assert PullSettings(ollama_host=f":{PORT}").daemon_host == f"http://127.0.0.1:{PORT}"
    assert daemon_status(f":{PORT}").host == f"http://127.0.0.1:{PORT}"
