import socket

from ollama_spec.models.daemon import daemon_status, freeing_advice, is_ollama_spec
from tests.fake_ollama import fake_daemon, ps_entry


def test_lists_what_the_daemon_holds_from_ollama_host(monkeypatch):
    with fake_daemon([ps_entry("llama3.1:8b", 6.2, 5.5), ps_entry("nomic-embed-text:latest", 0.3, 0)]) as url:
        monkeypatch.setenv("OLLAMA_HOST", url)
        status = daemon_status()
    assert status.reachable and status.host == url
    assert [(m.name, m.size_vram) for m in status.models] == [
        ("llama3.1:8b", int(5.5 * (1 << 30))),
        ("nomic-embed-text:latest", 0),
    ]
    assert freeing_advice(status) == [
        f"Ollama at {url} holds 5.5 GiB of GPU memory: llama3.1:8b (5.5 GiB)",
        "free it with: ollama stop llama3.1:8b",
        "or let Ollama unload models right after each request: OLLAMA_KEEP_ALIVE=0 (or keep_alive: 0 in the request)",
    ]


def test_nothing_on_the_gpu_means_no_advice():
    with fake_daemon([ps_entry("qwen2.5:0.5b", 0.5, 0)]) as url:
        status = daemon_status(url)
    assert status.reachable and freeing_advice(status) == []


def test_no_daemon_is_a_state_not_an_error():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    status = daemon_status(f"http://127.0.0.1:{port}")
    assert not status.reachable and "ollama serve" in status.error and status.models == ()


def test_an_http_error_is_said_with_its_status():
    with fake_daemon([], status=500) as url:
        status = daemon_status(url)
    assert not status.reachable and status.error.startswith("it answered /api/ps with HTTP 500")


def test_a_quoted_ollama_host_is_read_as_ollama_reads_it(monkeypatch):
    with fake_daemon([]) as url:
        monkeypatch.setenv("OLLAMA_HOST", f"'{url}' ")
        status = daemon_status()
    assert status.reachable and status.host == url


def test_any_answer_counts_as_a_daemon_and_nothing_raises(tmp_path):
    """What `pull` asks of the same probe: is anything there, and is it ollama-spec's own server."""
    import functools
    import threading
    from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer

    with fake_daemon([], status=500) as url:
        status = daemon_status(url)
        assert not status.reachable and status.answered and not is_ollama_spec(url)
    (tmp_path / "api").mkdir()
    (tmp_path / "api" / "ps").write_text("<html>a web page where a daemon was expected</html>")
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(SimpleHTTPRequestHandler, directory=tmp_path))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        status = daemon_status(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
        server.server_close()
    assert not status.reachable and not status.answered and "other than Ollama's JSON" in status.error
