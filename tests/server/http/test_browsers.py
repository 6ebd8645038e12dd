"""Web pages: a rebinding Host and a foreign Origin are refused as Ollama refuses them; this machine's
pages, apps and OLLAMA_ORIGINS may call, with and without an API key."""

import socket

import httpx
import pytest

from ollama_spec.engine.engine import Engine
from ollama_spec.server.http.browsers import allowed_host, is_loopback_bind, origin_pattern
from tests.conftest import engine_settings
from tests.serving import running_server

GENERATE = {"model": "m", "prompt": "x", "stream": False, "options": {"num_predict": 2}}


@pytest.fixture(scope="module")
def engine(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        yield engine


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1:8000",
        "localhost:8000",
        "localhost",
        "LOCALHOST:1",
        "[::1]:8000",
        "0.0.0.0:8000",
        "192.168.1.20:8000",
        "10.0.0.5",
        "chat.localhost:3000",
        "box.local",
        "db.internal:5432",
        "",
        socket.gethostname(),
    ],
)
def test_hosts_that_name_this_machine(host):
    assert allowed_host(host, local_addresses=set())


@pytest.mark.parametrize(
    "host",
    [
        "attacker.rebind.example:8000",
        "evil.com",
        "8.8.8.8:8000",
        "localhost.evil.com",
        "local",
        "example.internal.evil.com",
    ],
)
def test_hosts_that_do_not(host):
    assert not allowed_host(host, local_addresses=set())


def test_an_address_of_a_local_interface_is_this_machine():
    assert allowed_host("203.0.113.7:8000", local_addresses={"203.0.113.7"})


@pytest.mark.parametrize(
    "bound, loopback",
    [
        ("127.0.0.1", True),
        ("::1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("192.168.1.20", False),
        ("::", False),
    ],
)
def test_the_host_is_checked_only_on_a_loopback_bind(bound, loopback):
    assert is_loopback_bind(bound) is loopback


def test_origins_as_ollama_allows_them():
    allowed = origin_pattern(["https://chat.example.org", "https://*.corp.example", "chrome-extension://*"])
    for origin in (
        "http://localhost",
        "http://localhost:3000",
        "https://127.0.0.1:8443",
        "http://0.0.0.0:8080",
        "app://obsidian.md",
        "file://",
        "tauri://localhost",
        "vscode-webview://abc",
        "vscode-file://vscode-app",
        "https://chat.example.org",
        "https://wiki.corp.example",
        "chrome-extension://abcdef",
    ):
        assert allowed.fullmatch(origin), origin
    for origin in (
        "https://evil.example",
        "http://localhost.evil.example",
        "https://chat.example.org.evil.example",
        "http://127.0.0.1.nip.io",
        "null",
        "https://corp.example",
    ):
        assert not allowed.fullmatch(origin), origin
    assert origin_pattern(["*"]).fullmatch("https://anything.example")


def test_a_rebinding_host_is_refused(engine):
    """DNS rebinding: the page is same-origin with 127.0.0.1:PORT, so only its Host gives it away."""
    with running_server(engine) as (url, _):
        port = url.rsplit(":", 1)[1]
        rebinding = {"Host": f"attacker.rebind.example:{port}", "Origin": f"http://attacker.rebind.example:{port}"}
        refused = httpx.get(url + "/api/tags", headers=rebinding)
        assert refused.status_code == 403 and refused.content == b""
        assert httpx.post(url + "/api/generate", json=GENERATE, headers=rebinding).status_code == 403
        assert httpx.get(url + "/api/tags", headers={"Host": f"localhost:{port}"}).status_code == 200
        mine = {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}"}  # a page this server serves
        assert httpx.post(url + "/api/generate", json=GENERATE, headers=mine).status_code == 200


def test_a_server_on_the_network_does_not_check_the_host(engine):
    """Bound beyond loopback, any name may reach it, as with Ollama (then --api-key is the guard)."""
    with running_server(engine, host="0.0.0.0") as (url, _):
        assert httpx.get(url + "/api/tags", headers={"Host": "ollama.example.org"}).status_code == 200


@pytest.mark.parametrize("api_key", [None, "sekret"])
def test_a_foreign_page_cannot_make_the_server_generate(engine, api_key):
    """A text/plain POST needs no preflight: it must be refused for its Origin, before it runs."""
    key = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with running_server(engine, api_key=api_key, origins=("https://chat.example.org",)) as (url, state):
        port = url.rsplit(":", 1)[1]
        before = state.metrics.render()
        foreign = httpx.post(
            url + "/api/generate",
            content=b'{"model":"m","prompt":"x","stream":false}',
            headers={"Origin": "https://evil.example", "Content-Type": "text/plain", **key},
        )
        assert foreign.status_code == 403 and foreign.content == b""
        assert state.metrics.render() == before  # nothing ran
        for origin in ("https://evil.example", "null", f"http://attacker.example:{port}"):
            assert httpx.get(url + "/api/tags", headers={"Origin": origin, **key}).status_code == 403, origin
        for origin in (
            "http://localhost:3000",
            "http://127.0.0.1:8080",
            "app://obsidian.md",
            "https://chat.example.org",
        ):
            answer = httpx.post(url + "/api/generate", json=GENERATE, headers={"Origin": origin, **key})
            assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == origin, origin


def test_a_foreign_preflight_is_refused_and_an_allowed_one_answered(engine):
    with running_server(engine, api_key="sekret") as (url, _):

        def preflight(origin):
            return httpx.options(
                url + "/api/chat",
                headers={
                    "Origin": origin,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type",
                },
            )

        assert preflight("https://evil.example").status_code == 403
        allowed = preflight("http://localhost:5173")
        assert allowed.status_code == 200 and allowed.headers["access-control-allow-origin"] == "http://localhost:5173"
