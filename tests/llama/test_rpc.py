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

from ollama_spec.errors import InvalidSetting, RpcUnavailable
from ollama_spec.llama import rpc

GENERATE = (
    "generate",
    "tiny-target",
    "--draft",
    "tiny-draft",
    "-t",
    "0",
    "-n",
    "24",
    "-k",
    "3",
    "--threads",
    "1",
    "--json",
    "Tell me about the sea",
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ollama_spec(*args: str, env: dict, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ollama_spec", *args], capture_output=True, text=True, env=env, timeout=timeout
    )


@contextmanager
def rpc_server(tmp_path: Path, env: dict, *args: str):
    """`ollama-spec rpc-server` on a free loopback port; its endpoint once it answers HELLO."""
    port = free_port()
    log = open(tmp_path / f"rpc-{port}.log", "w")  # noqa: SIM115 - open as long as the server runs
    # one thread: on a 2-core machine, servers' spinning CPU threads would starve the client's
    process = subprocess.Popen(
        [sys.executable, "-m", "ollama_spec", "rpc-server", "--port", str(port), "--threads", "1", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
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


@pytest.fixture
def in_process(invoke, tiny_store, monkeypatch):
    """The CLI in this process, for what registers no RPC server (a refusal before any connection)."""
    monkeypatch.setenv("GGML_NO_BACKTRACE", "1")  # restored after the test: registering sets it
    return lambda *args: invoke(*args, env={"OLLAMA_MODELS": str(tiny_store), "OLLAMA_SPEC_REPACK": "0"})


def test_greedy_output_over_one_and_two_rpc_servers_equals_the_local_run(env, tmp_path, in_process):
    local = in_process(*GENERATE)
    assert local.exit_code == 0, local.output
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


def test_an_unreachable_server_is_one_line_and_quick(in_process):
    port = free_port()  # nothing listens there
    started = time.monotonic()
    result = in_process(*GENERATE, "--rpc", f"127.0.0.1:{port}")
    assert result.exit_code == 1
    # on loopback the server is this machine's: no --host 0.0.0.0 to open it to the network
    assert result.stderr.strip() == (
        f"Error: cannot reach the RPC server at 127.0.0.1:{port} (Connection refused); "
        f"start one with `ollama-spec rpc-server --port {port}`, or forward the port "
        f"from the server's machine (ssh -L {port}:127.0.0.1:{port} gpu-box)"
    )
    assert time.monotonic() - started < 60


def test_another_machine_is_told_to_listen_on_its_network_address():
    assert rpc._start_hint(rpc.Endpoint("192.168.1.20", 50052)) == (
        "start one there with `ollama-spec rpc-server --host 0.0.0.0 --port 50052`"
    )


def test_one_server_under_two_names_is_refused_before_anything_connects(in_process):
    port = free_port()  # nothing listens: the refusal must come before any connection
    result = in_process(*GENERATE, "--rpc", f"127.0.0.1:{port},localhost:{port}")
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        f"Error: RPC servers 127.0.0.1:{port} and localhost:{port} are the same server "
        f"(127.0.0.1:{port}): name each server once"
    )


def test_a_server_busy_with_another_client_is_said_to_be_busy(env, tmp_path):
    with rpc_server(tmp_path, env) as endpoint:
        host, port = endpoint.split(":")
        # the first client: HELLO answered, connection kept open, as a loaded model keeps it
        with socket.create_connection((host, int(port)), timeout=5) as first:
            first.sendall(struct.pack("<BQ", rpc.HELLO, rpc.CONN_CAPS_SIZE) + bytes(rpc.CONN_CAPS_SIZE))
            assert rpc._receive(first, 8 + 4 + rpc.CONN_CAPS_SIZE)[8] == rpc.PROTOCOL_MAJOR
            with pytest.raises(
                RpcUnavailable,
                match=r"an rpc-server busy with another client \(it serves one at "
                r"a time\), or another program on that port",
            ):
                rpc.probe(rpc.Endpoint(host, int(port)), timeout=1)


def test_rpc_server_help_says_it_serves_one_client_at_a_time(invoke):
    result = invoke("rpc-server", "--help")
    assert result.exit_code == 0 and "It serves one client at a time" in result.output


def test_rpc_server_listens_on_localhost_as_127_0_0_1(env, tmp_path):
    # llama.cpp's server takes dotted IPv4 only; the fixture waits for a HELLO on 127.0.0.1
    with rpc_server(tmp_path, env, "--host", "localhost") as endpoint:
        assert endpoint.startswith("127.0.0.1:")


@contextmanager
def fake_server(answer: bytes | None, every_connection: bool = False):
    """A loopback TCP server that answers the first request with `answer` (None: says nothing) and
    holds the connection; `every_connection`: answers each connection's request and closes it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(0.2)
    done = threading.Event()

    def serve():
        while not done.is_set():
            try:
                connection, _ = listener.accept()
            except OSError:
                continue
            with connection:
                connection.recv(64)
                if answer is not None:
                    connection.sendall(answer)
                if not every_connection:
                    done.wait(5)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield rpc.Endpoint("127.0.0.1", listener.getsockname()[1])
    finally:
        done.set()
        thread.join(5)
        listener.close()


def test_a_server_lost_after_the_probe_aborts_with_llama_cpps_line_and_no_backtrace(env):
    # answers HELLO as this build's protocol, then closes every connection: an rpc-server that
    # goes away right after the probe
    hello = struct.pack("<QBBB", 4 + rpc.CONN_CAPS_SIZE, rpc.PROTOCOL_MAJOR, rpc.PROTOCOL_MINOR, 0)
    with fake_server(hello + bytes(rpc.CONN_CAPS_SIZE), every_connection=True) as endpoint:
        result = ollama_spec("check", "tiny-target", "--rpc", str(endpoint), env=env, timeout=90)
    assert result.returncode != 0  # llama.cpp aborts: no retry exists in its RPC client
    assert "Remote RPC server crashed or returned malformed response" in result.stderr
    assert "backtrace" not in result.stderr.lower() and "#1 " not in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) < 10, result.stderr


def test_probe_tells_a_silent_program_and_another_protocol_version_from_an_rpc_server():
    with fake_server(None) as endpoint:
        started = time.monotonic()
        with pytest.raises(RpcUnavailable, match="gave no answer within 0.5 s: an rpc-server busy"):
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


@pytest.mark.parametrize(
    "text",
    [
        "localhost",
        "host:",
        ":50052",
        "host:0",
        "host:70000",
        "a:1,a:1",
        "127.0.0.1:\u00b2",
        "127.0.0.1:\uff150111",
        "127.0.0.1:\u0665",
        "a b:1",
        "http://127.0.0.1:50052",
        "127.0.0.1:50052 127.0.0.1:50053",
    ],
)
def test_bad_endpoints_are_refused(text):
    with pytest.raises(InvalidSetting, match="--rpc: .* (is not host:port|named twice)"):
        rpc.parse_endpoints(text)


@pytest.mark.parametrize("text", ["[::1]:50052", "::1:50052", "[fe80::1]:1", "::1"])
def test_ipv6_endpoints_are_refused_as_llama_cpp_cannot_use_them(text):
    with pytest.raises(InvalidSetting, match="llama.cpp's RPC takes IPv4 addresses or host names only"):
        rpc.parse_endpoints(text)


@pytest.mark.parametrize("host", ["::1", "[::1]", "::"])
def test_rpc_server_refuses_ipv6_hosts_in_one_line(invoke, host):
    result = invoke("rpc-server", "--host", host, "--port", free_port())
    assert result.exit_code == 1
    assert result.output.strip() == (
        f"Error: --host {host}: llama.cpp's RPC takes IPv4 addresses or host names "
        "only, not IPv6 (0.0.0.0 listens on every IPv4 address)"
    )


def test_the_variable_is_named_in_its_errors_and_blank_items_in_it_are_left_out(invoke, tiny_store, monkeypatch):
    monkeypatch.setenv("GGML_NO_BACKTRACE", "1")  # restored after the test: registering sets it
    args = ("check", "tiny-target", "--models-dir", tiny_store)
    bad = invoke(*args, env={"OLLAMA_SPEC_RPC": "gpu-box"})
    assert bad.exit_code == 1 and bad.output.strip().startswith("Error: $OLLAMA_SPEC_RPC: 'gpu-box' is not host:port")
    port = free_port()
    trailing = invoke(*args, env={"OLLAMA_SPEC_RPC": f" 127.0.0.1:{port}, ,"})
    assert trailing.exit_code == 1
    assert trailing.output.strip().startswith(f"Error: cannot reach the RPC server at 127.0.0.1:{port}")
    blank = invoke(*args, env={"OLLAMA_SPEC_RPC": "  "})
    assert blank.exit_code == 0 and "RPC" not in blank.output
    flag = invoke(*args, "--rpc", "gpu-box", env={"OLLAMA_SPEC_RPC": "  "})
    assert flag.output.strip().startswith("Error: --rpc: 'gpu-box' is not host:port")


def test_endpoints_parse_as_llama_cpp_takes_them():
    assert rpc.parse_endpoints("10.0.0.2:50052, gpu-box:50053") == (
        rpc.Endpoint("10.0.0.2", 50052),
        rpc.Endpoint("gpu-box", 50053),
    )


def test_rpc_server_refuses_a_busy_port_and_an_unknown_device(invoke):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = invoke("rpc-server", "--port", port)
    assert result.exit_code == 1
    assert result.output.strip().endswith(
        f"port {port} on 127.0.0.1 is in use (another rpc-server?): pick another with --port"
    )
    result = invoke("rpc-server", "--port", free_port(), "--device", "CUDA7")
    assert result.exit_code == 1 and "--device CUDA7: no such device here (devices: CPU" in result.output
    assert "rpc-server on" not in result.output  # refused before it says it serves


def test_rpc_server_lends_each_device_once(env):
    # a subprocess: were the device lent twice, the server would start and serve until killed
    result = ollama_spec("rpc-server", "--port", str(free_port()), "--device", "CPU,cpu", env=env, timeout=30)
    assert result.returncode == 1  # ggml matches device names in any case: cpu is CPU
    assert result.stderr.strip() == "Error: --device cpu: CPU is already named; lend each device once"


def test_bench_rpc_times_the_target_without_the_hop_and_checks_every_row(env, tmp_path):
    with rpc_server(tmp_path, env) as endpoint:
        result = ollama_spec(
            "bench",
            "tiny-target",
            "-d",
            "tiny-draft",
            "-k",
            "2",
            "--runs",
            "1",
            "--max-tokens",
            "8",
            "--no-warmup",
            "--no-ngram",
            "--threads",
            "1",
            "--rpc",
            endpoint,
            "--out",
            tmp_path / "b",
            env=env,
        )
    assert result.returncode == 0, result.stderr
    rows = {row["label"]: row for row in json.loads((tmp_path / "b" / "results.json").read_text())["rows"]}
    assert set(rows) == {"target alone", "speculative K=2", "target alone, no RPC"}  # no reference rows
    assert all(row["identical_to_target_alone"] in (True, None) for row in rows.values())
    assert f"RPC ({endpoint}): the target alone " in result.stdout and "on this machine only" in result.stdout
