"""`bench --url` against a real streaming HTTP server on 127.0.0.1 (no mocked transport)."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from ollama_spec.bench.prompts import Prompt
from ollama_spec.bench.remote import RemoteResult, RemoteSample, RemoteSettings, ServerError, run_remote

PIECES = ["Hello", ",", " world", "!", " More", " text"]


class ChatHandler(BaseHTTPRequestHandler):
    requests: ClassVar[list[dict]] = []

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/chat/completions":
            self.send_response(404)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b'{"error": "no such route"}')
            return
        ChatHandler.requests.append(body)
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        pieces = PIECES[: body["max_tokens"]]
        self.wfile.write(b": keep-alive comment\n\n")
        for piece in pieces:
            chunk = {"choices": [{"index": 0, "delta": {"content": piece}}]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        if body.get("stream_options", {}).get("include_usage") and body["model"] != "no-usage":
            usage = {"choices": [], "usage": {"completion_tokens": len(pieces) * 2}}
            if body["model"] == "drafting":  # llama-server's timings ride on its usage chunk
                usage["timings"] = {"predicted_n": len(pieces) * 2, "draft_n": 6, "draft_n_accepted": 4}
            self.wfile.write(f"data: {json.dumps(usage)}\n\n".encode())
        self.wfile.write(b"data: [DONE]\n\n")


@pytest.fixture(scope="module")
def server():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), ChatHandler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_streams_every_prompt_and_reports_medians(invoke, server, tmp_path):
    ChatHandler.requests.clear()
    out = tmp_path / "remote"
    result = invoke("bench", "my-model", "--url", server, "--runs", "2", "--max-tokens", "4", "--out", out)
    assert result.exit_code == 0, result.output
    assert len(ChatHandler.requests) == 1 + 2 * 5  # warm-up, then 2 runs of the 5 built-in prompts
    sent = ChatHandler.requests[-1]
    assert sent["stream"] is True and sent["model"] == "my-model" and sent["max_tokens"] == 4
    assert sent["temperature"] == 0
    explanation = next(r for r in ChatHandler.requests if "microservices" in r["messages"][-1]["content"])
    assert explanation["messages"][0] == {"role": "system", "content": "Anda pakar arsitektur perangkat lunak."}
    for name in ("code", "factual", "explanation", "translation", "creative"):
        assert name in result.output
    assert f"my-model at {server}: median" in result.output
    data = json.loads((out / "results.json").read_text())
    assert len(data["samples"]) == 10
    assert all(s["tokens"] == 8 for s in data["samples"])  # the server's usage count wins over chunks
    assert data["tokens_per_second"] > 0 and data["time_to_first_token_s"] > 0
    assert (out / "results.md").exists()


def test_concurrent_clients_report_the_aggregate_and_the_latencies(invoke, server, tmp_path):
    ChatHandler.requests.clear()
    out = tmp_path / "remote"
    result = invoke(
        "bench", "m", "--url", server, "--runs", "1", "--max-tokens", "4", "--concurrency", "3", "--out", out
    )
    assert result.exit_code == 0, result.output
    assert len(ChatHandler.requests) == 1 + 3 * 5  # warm-up, then 3 clients x the 5 built-in prompts
    assert "3 clients at once: " in result.output and "latency p50" in result.output
    data = json.loads((out / "results.json").read_text())
    assert data["concurrency"] == 3 and len(data["samples"]) == 15
    # all the tokens over the wall time: more than one request's rate when they overlap
    assert data["aggregate_tokens_per_second"] > 0 and data["latency_p95_s"] >= data["latency_p50_s"] > 0


def test_every_request_asks_for_max_tokens_as_the_in_process_rows_generate(server):
    """The in-process rows never stop at the end of a turn: a served request that did (a short answer)
    would be timed over other tokens, its fixed costs over fewer of them."""
    ChatHandler.requests.clear()
    run_remote(RemoteSettings(url=server, model="m", max_tokens=4, runs=1, warmup=False), [Prompt("p", "Hi")])
    assert [r["ignore_eos"] for r in ChatHandler.requests] == [True]


def test_a_requests_rate_is_each_runs_tokens_over_its_decode_times_as_in_process():
    """As samples.Row.run_rates: per run, the tokens after each request's first over the sum of their
    decode times; the median over runs. Not the median of the requests' own rates: that picks one
    prompt's rate, where the in-process rows weigh every prompt by its tokens."""
    settings = RemoteSettings(url="http://127.0.0.1:1/v1", model="m")
    samples = [  # (tokens - 1) / (total - first): 100/1.0, 100/0.5, 100/0.5 a run; the run: 300 / 2.0
        RemoteSample(prompt, run, 101, 0.1, total)
        for run in (0, 1, 2)
        for prompt, total in (("slow", 1.1), ("fast", 0.6), ("also fast", 0.6))
    ]
    samples[-1].total_s = 1.1  # the last run: 300 / 2.5
    result = RemoteResult(settings, samples)
    assert result.run_rates() == pytest.approx([150.0, 150.0, 120.0])
    assert result.tokens_per_second == pytest.approx(150.0)


def test_concurrency_below_one_is_refused(invoke, server):
    result = invoke("bench", "m", "--url", server, "--concurrency", "0")
    assert result.exit_code == 2 and "--concurrency" in result.output


def test_without_usage_each_chunk_is_a_token(server):
    settings = RemoteSettings(url=server, model="no-usage", max_tokens=5, runs=1, warmup=False)
    result = run_remote(settings, [Prompt("p", "Hi")])
    assert [s.tokens for s in result.samples] == [5]
    assert result.samples[0].first_token_s <= result.samples[0].total_s


def test_unreachable_server_is_one_line(invoke):
    url = f"http://127.0.0.1:{free_port()}/v1"
    result = invoke("bench", "m", "--url", url)
    assert result.exit_code == 1
    assert (
        result.output.strip() == f"Error: cannot reach the server at {url} (connection refused); start it or fix --url"
    )


def test_http_errors_are_one_line(invoke, server):
    url = server.removesuffix("/v1") + "/wrong/v1"
    result = invoke("bench", "m", "--url", url)
    assert result.exit_code == 1
    assert result.output.strip() == f'Error: {url}/chat/completions answered HTTP 404: {{"error": "no such route"}}'


def test_a_404_without_v1_says_the_url_is_the_api_base(invoke, server):
    url = server.removesuffix("/v1")
    result = invoke("bench", "m", "--url", url)
    assert result.exit_code == 1
    assert result.output.strip().endswith(
        '{"error": "no such route"}; --url is the API base, which ends in /v1 on '
        "OpenAI-compatible servers (e.g. http://127.0.0.1:8000/v1)"
    )


def test_a_url_ending_in_the_chat_completions_path_is_taken_as_its_api_base(invoke, server):
    assert RemoteSettings(url=server + "/chat/completions/", model="m").url == server
    assert RemoteSettings(url=server + "/", model="m").endpoint == server + "/chat/completions"
    result = invoke("bench", "m", "--url", server + "/chat/completions", "--runs", "1", "--max-tokens", "3")
    assert result.exit_code == 0, result.output
    assert f"m at {server}: median" in result.output


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("http://[::1/v1", "Error: --url 'http://[::1/v1' is not a valid URL (Invalid port: ':1')"),
        (
            "http://127.0.0.1:99999/v1",
            "Error: --url 'http://127.0.0.1:99999/v1': port 99999 is out of range (1 to 65535)",
        ),
        ("http://", "Error: --url 'http://' names no host; give the API base, e.g. http://127.0.0.1:8000/v1"),
    ],
)
def test_a_malformed_url_is_one_line_before_any_request(invoke, url, says):
    result = invoke("bench", "m", "--url", url)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit)
    assert result.output.strip() == says


def test_url_must_be_http(invoke):
    result = invoke("bench", "m", "--url", "localhost:8080")
    assert result.exit_code == 1
    assert result.output.strip() == "Error: --url must start with http:// or https://, got 'localhost:8080'"


def test_server_errors_are_typed():
    with pytest.raises(ServerError, match="cannot reach"):
        run_remote(RemoteSettings(url=f"http://127.0.0.1:{free_port()}", model="m", warmup=False), [Prompt("p", "x")])


def test_the_drafts_a_server_says_it_accepted_are_counted(invoke, server, tmp_path):
    out = tmp_path / "remote"
    result = invoke("bench", "drafting", "--url", server, "--runs", "1", "--max-tokens", "4", "--out", out)
    assert result.exit_code == 0, result.output
    assert "drafts accepted, as the server's timings say: 20 of 30 (66.7%)" in result.output
    data = json.loads((out / "results.json").read_text())
    assert (data["drafted"], data["accepted"]) == (30, 20) and data["samples"][0]["accepted"] == 4
    plain = invoke("bench", "my-model", "--url", server, "--runs", "1", "--max-tokens", "4")
    assert "drafts accepted" not in plain.output  # a server that does not say: nothing made up
