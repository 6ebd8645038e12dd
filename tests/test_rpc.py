"""llama.cpp's RPC backend for real, on loopback: rpc-server subprocesses, --rpc on the CLI, bad endpoints.

Everything that registers an RPC server runs in a subprocess: a registration lasts as long as
the process, and llama.cpp aborts a process whose server has gone away.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from ollama_spec import rpc
from ollama_spec.errors import InvalidSetting, RpcUnavailable

GENERATE = ("generate", "tiny-target", "--draft", "tiny-draft", "-t", "0", "-n", "24", "-k", "3", "--threads", "1",
            "--json", "Tell me about the sea")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ollama_spec(*args: str, env: dict, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ollama_spec", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@contextmanager
def rpc_server(tmp_path: Path, env: dict):
    """`ollama-spec rpc-server` on a free loopback port; its endpoint once it answers HELLO."""
    port = free_port()
    log = open(tmp_path / f"rpc-{port}.log", "w")
    # one thread: on a 2-core machine, servers' spinning CPU threads would starve the client's
    process = subprocess.Popen([sys.executable, "-m", "ollama_spec", "rpc-server", "--port", str(port), "-t", "1"],
                               stdout=log, stderr=subprocess.STDOUT, env=env)
    endpoint = rpc.Endpoint("127.0.0.1", port)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                rpc.probe(endpoint, timeout=1)
                break
            except RpcUnavailable:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"rpc-server did not start: {(tmp_path / f'rpc-{port}.log').read_text()}")
                time.sleep(0.2)
        yield str(endpoint)
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()


@pytest.fixture
def env(tiny_store, isolated_user_paths):
    return {**os.environ, "OLLAMA_MODELS": str(tiny_store), "OLLAMA_SPEC_REPACK": "0"}


def test_greedy_output_over_one_and_two_rpc_servers_equals_the_local_run(env, tmp_path):
    local = ollama_spec(*GENERATE, env=env)
    assert local.returncode == 0, local.stderr
    with rpc_server(tmp_path, env) as first, rpc_server(tmp_path, env) as second:
        one = ollama_spec(*GENERATE, "--rpc", first, "--verbose", env=env)
        two = ollama_spec(*GENERATE, "--rpc", f"{first},{second}", "--verbose", env=env)
    for run in (one, two):
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["text"] == json.loads(local.stdout)["text"]
    # the target's weights really went to the servers (llama.cpp's own log), the draft's did not
    assert f"[{first}] model buffer size" in one.stderr
    assert f"[{first}] model buffer size" in two.stderr and f"[{second}] model buffer size" in two.stderr
    draft_load = two.stderr.rsplit("load_tensors: loading model tensors", 1)[1]
    assert "RPC" not in draft_load.split("llama_context")[0]


def test_check_counts_the_servers_memory(env, tmp_path):
    with rpc_server(tmp_path, env) as endpoint:
        result = ollama_spec("check", "tiny-target", "--draft", "tiny-draft", "--rpc", endpoint, "--json", env=env)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    remote = [d for d in plan["devices"] if d["kind"] == "rpc"]
    assert len(remote) == 1 and endpoint in remote[0]["name"] and remote[0]["total"] > 0
    assert plan["verdict"] == "full_offload"


def test_an_unreachable_server_is_one_line_and_quick(env):
    port = free_port()  # nothing listens there
    started = time.monotonic()
    result = ollama_spec(*GENERATE, "--rpc", f"127.0.0.1:{port}", env=env)
    assert result.returncode == 1
    assert result.stderr.strip() == (f"Error: cannot reach the RPC server at 127.0.0.1:{port} (Connection refused); "
                                     f"start one there with `ollama-spec rpc-server --host 0.0.0.0 --port {port}`")
    assert time.monotonic() - started < 60


@contextmanager
def fake_server(answer: bytes | None):
    """A loopback TCP server that answers the first request with `answer` (None: says nothing)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    done = threading.Event()

    def serve():
        connection, _ = listener.accept()
        with connection:
            connection.recv(64)
            if answer is not None:
                connection.sendall(answer)
            done.wait(5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield rpc.Endpoint("127.0.0.1", listener.getsockname()[1])
    finally:
        done.set()
        listener.close()


def test_probe_tells_a_silent_program_and_another_protocol_version_from_an_rpc_server():
    with fake_server(None) as endpoint:
        started = time.monotonic()
        with pytest.raises(RpcUnavailable, match="does not answer as a llama.cpp RPC server"):
            rpc.probe(endpoint, timeout=0.5)
        assert time.monotonic() - started < 5  # bounded: llama.cpp itself would wait forever
    with fake_server(b"HTTP/1.1 400 Bad Request\r\n\r\n") as endpoint:
        with pytest.raises(RpcUnavailable, match="does not answer as a llama.cpp RPC server"):
            rpc.probe(endpoint, timeout=2)
    older = struct.pack("<QBBBB", 4 + rpc.CONN_CAPS_SIZE, 6, 1, 0, 0) + bytes(rpc.CONN_CAPS_SIZE)
    with fake_server(older) as endpoint:
        with pytest.raises(RpcUnavailable, match=r"speaks protocol 6\.1\.0 and this build speaks 7\.0"):
            rpc.probe(endpoint, timeout=2)
    current = struct.pack("<QBBBB", 4 + rpc.CONN_CAPS_SIZE, 7, 0, 3, 0) + bytes(rpc.CONN_CAPS_SIZE)
    with fake_server(current) as endpoint:
        assert rpc.probe(endpoint, timeout=2) == (7, 0, 3)


@pytest.mark.parametrize("text", ["localhost", "host:", ":50052", "host:0", "host:70000", "a:1,a:1", "[::1]:50052"])
def test_bad_endpoints_are_refused(text):
    with pytest.raises(InvalidSetting, match="--rpc"):
        rpc.parse_endpoints(text)


def test_endpoints_parse_as_llama_cpp_takes_them():
    assert rpc.parse_endpoints("10.0.0.2:50052, gpu-box:50053") == (rpc.Endpoint("10.0.0.2", 50052),
                                                                    rpc.Endpoint("gpu-box", 50053))


def test_rpc_server_refuses_a_busy_port_and_an_unknown_device(invoke):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = invoke("rpc-server", "--port", port)
    assert result.exit_code == 1
    assert result.output.strip().endswith(f"port {port} on 127.0.0.1 is in use (another rpc-server?): pick another "
                                          "with --port")
    result = invoke("rpc-server", "--port", free_port(), "--device", "CUDA7")
    assert result.exit_code == 1 and "--device CUDA7: no such device here (devices: CPU" in result.output


def test_bench_rpc_times_the_target_without_the_hop_and_checks_every_row(env, tmp_path):
    with rpc_server(tmp_path, env) as endpoint:
        result = ollama_spec("bench", "tiny-target", "-d", "tiny-draft", "-k", "2", "--runs", "1", "--max-tokens", "8",
                             "--no-warmup", "--no-ngram", "--threads", "1", "--rpc", endpoint, "--out", tmp_path / "b",
                             env=env)
    assert result.returncode == 0, result.stderr
    rows = {row["label"]: row for row in json.loads((tmp_path / "b" / "results.json").read_text())["rows"]}
    assert set(rows) == {"target alone", "speculative K=2", "target alone, no RPC"}  # no reference rows
    assert all(row["identical_to_target_alone"] in (True, None) for row in rows.values())
    assert f"RPC ({endpoint}): the target alone " in result.stdout and "on this machine only" in result.stdout
