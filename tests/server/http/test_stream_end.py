"""A streamed answer's end reaches the client in one write: its last text, the finish, the usage and the
stream's end in one HTTP chunk, so a client wakes once for them (protocol/framing.Last). Read with h11,
which tells where each chunk of the chunked body begins and ends, as the server wrote them."""

import json
import socket

import h11
import pytest

from tests.serving import serving_tiny_pair


@pytest.fixture(scope="module")
def server(tiny_models):
    with serving_tiny_pair(tiny_models) as (url, _):
        yield url


def _chunks(url: str, path: str, body: dict) -> list[bytes]:
    """The chunked body's chunks, each as the server wrote it."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    conn = h11.Connection(h11.CLIENT)
    headers = [("Host", f"{host}:{port}"), ("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(conn.send(h11.Request(method="POST", target=path, headers=headers)))
        sock.sendall(conn.send(h11.Data(data=data)) + conn.send(h11.EndOfMessage()))
        chunks, current = [], b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(sock.recv(65536))
            elif isinstance(event, h11.Data):
                current += event.data
                if event.chunk_end:
                    chunks.append(current)
                    current = b""
            elif isinstance(event, h11.EndOfMessage):
                return chunks


def test_a_chat_streams_end_is_one_chunk(server):
    chunks = _chunks(
        server,
        "/v1/chat/completions",
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Count with me"}],
            "max_tokens": 12,
            "stream": True,
            "stream_options": {"include_usage": True},
        },
    )
    events = chunks[-1].decode().strip().split("\n\n")
    assert [json.loads(e[6:])["choices"][0]["finish_reason"] for e in events[-4:-2]] == [None, "length"]
    assert json.loads(events[-2][6:])["usage"]["completion_tokens"] == 12
    assert events[-1] == "data: [DONE]"
    assert all(b"finish_reason" not in chunk or b'"finish_reason": null' in chunk for chunk in chunks[:-1])


def test_an_ollama_streams_last_text_and_its_counts_are_one_chunk(server):
    chunks = _chunks(
        server,
        "/api/chat",
        {"model": "m", "messages": [{"role": "user", "content": "Count with me"}], "options": {"num_predict": 12}},
    )
    lines = [json.loads(line) for line in chunks[-1].decode().splitlines()]
    assert [line["done"] for line in lines] == [False, True] and lines[0]["message"]["content"]
    assert lines[-1]["eval_count"] == 12


def test_a_responses_streams_last_events_are_one_chunk(server):
    chunks = _chunks(
        server, "/v1/responses", {"model": "m", "input": "Count with me", "max_output_tokens": 12, "stream": True}
    )
    types = [event.split("\n")[0] for event in chunks[-1].decode().strip().split("\n\n")]
    assert types[-4:] == [
        "event: response.output_text.done",
        "event: response.content_part.done",
        "event: response.output_item.done",
        "event: response.incomplete",
    ]
    assert not any(b"response.output_text.done" in chunk for chunk in chunks[:-1])
