"""llama.cpp's RPC backend: other machines' devices for the target's layers, and serving this one's.

An RPC server (`ollama-spec rpc-server`, or llama.cpp's own `rpc-server`) exposes its machine's
devices over TCP. Registering it adds them to ggml's device list, where llama.cpp places the
target's layers on them as on local GPUs: RPC devices first, then local GPUs, in proportion to
their free memory or to --tensor-split. The draft is loaded on the local devices only: it runs
K times per step and each network round-trip would eat what it saves.

llama.cpp aborts the whole process, with no timeout, when a server cannot be reached or speaks
another protocol version. So every endpoint is first probed from here, with a bounded connect
and the protocol's own HELLO, and a bad one becomes a one-line error.

The protocol has no authentication and no encryption: anyone who reaches the port can allocate
memory on the server's devices and run computations there. Servers bind loopback unless told
otherwise; expose one only on a trusted network.

The protocol version is that of the llama.cpp inside the pinned llama-cpp-python; a build with
another version would be told apart by the probe as "another protocol", so both sides must run
the same ollama-spec install (or a matching llama.cpp rpc-server).
"""

from __future__ import annotations

import ctypes
import ipaddress
import os
import re
import socket
import struct
from dataclasses import dataclass

from ollama_spec.errors import InvalidSetting, RpcUnavailable
from ollama_spec.llama.backends import describe_device, ggml
from ollama_spec.planning.backends import BackendDevice
from ollama_spec.planning.devices import Device, rpc_device

DEFAULT_PORT = 50052  # llama.cpp's rpc-server default
CONNECT_TIMEOUT = 5.0  # seconds for the connect and for the HELLO answer
# ggml-rpc.h and transport.h of the llama.cpp that llama-cpp-python (pinned) carries.
PROTOCOL_MAJOR, PROTOCOL_MINOR = 7, 0
HELLO = 14  # RPC_CMD_HELLO, fixed across versions so that any two can tell each other apart
CONN_CAPS_SIZE = 24
IPV4_ONLY = "llama.cpp's RPC takes IPv4 addresses or host names only, not IPv6"
SECURITY_NOTE = (
    "the RPC protocol has no authentication: anyone who can reach the port can use this "
    "machine's devices; run it only on a trusted network"
)


@dataclass(frozen=True)
class Endpoint:
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"


def parse_endpoints(text: str, source: str = "--rpc") -> tuple[Endpoint, ...]:
    """`host:port[,host:port...]` as llama.cpp's --rpc takes it (host names or IPv4 addresses).

    `source` names where the text came from (--rpc, $OLLAMA_SPEC_RPC) in errors.
    """
    endpoints = []
    for item in (part.strip() for part in text.split(",")):
        host, sep, port = item.rpartition(":")
        if is_ipv6(item, host):
            raise InvalidSetting(f"{source}: {item!r}: {IPV4_ONLY} (e.g. 127.0.0.1:{DEFAULT_PORT})")
        # ASCII digits only: str.isdigit() also takes '²' and full-width digits
        if (
            not sep
            or not re.fullmatch("[A-Za-z0-9._-]+", host)
            or not re.fullmatch("[0-9]{1,5}", port)
            or not 0 < int(port) < 65536
        ):
            raise InvalidSetting(
                f"{source}: {item!r} is not host:port (e.g. 192.168.1.20:{DEFAULT_PORT}); "
                "separate several servers with commas"
            )
        endpoints.append(Endpoint(host, int(port)))
    if len(set(endpoints)) != len(endpoints):
        raise InvalidSetting(f"{source}: a server is named twice in {text!r}")
    return tuple(endpoints)


def is_ipv6(item: str, host: str) -> bool:
    """`[::1]:50052`, `::1:50052` or a bare `::1`."""
    for text in (host.strip("[]"), item.strip("[]")):
        try:
            ipaddress.IPv6Address(text)
            return True
        except ValueError:
            pass
    return item.startswith("[")


def ipv4_address(host: str) -> str:
    """`host` as the IPv4 address llama.cpp's RPC code connects to or listens on (it calls
    gethostbyname and inet_addr: AF_INET only); OSError for an unknown name."""
    try:
        return socket.gethostbyname(host)
    except UnicodeError as exc:  # a label over 63 characters, say
        raise socket.gaierror(str(exc)) from None


def _require_distinct(endpoints: tuple[Endpoint, ...]) -> None:
    """Two names of one server would hang llama.cpp for good: the server serves one client at a time,
    and the second connection waits behind the first, which this same process holds open."""

    def key(endpoint: Endpoint) -> tuple[str, int]:
        try:
            return ipv4_address(endpoint.host), endpoint.port
        except OSError:
            raise RpcUnavailable(f"RPC server {endpoint}: unknown host {endpoint.host!r}") from None

    seen = {key(e): e for e in _registered}
    for endpoint in endpoints:
        address, port = key(endpoint)
        other = seen.setdefault((address, port), endpoint)
        if other != endpoint:
            raise InvalidSetting(
                f"RPC servers {other} and {endpoint} are the same server ({address}:{port}): name each server once"
            )


def probe(endpoint: Endpoint, timeout: float = CONNECT_TIMEOUT) -> tuple[int, int, int]:
    """Connect and say HELLO as llama.cpp does; the server's protocol version, or RpcUnavailable."""
    start = _start_hint(endpoint)
    try:
        sock = socket.create_connection((endpoint.host, endpoint.port), timeout=timeout)
    except socket.gaierror:
        raise RpcUnavailable(f"RPC server {endpoint}: unknown host {endpoint.host!r}") from None
    except TimeoutError:
        raise RpcUnavailable(
            f"RPC server {endpoint}: no connection within {timeout:g} s (a firewall, the wrong "
            f"address, or an rpc-server busy with another client?); {start}"
        ) from None
    except OSError as exc:
        raise RpcUnavailable(f"cannot reach the RPC server at {endpoint} ({exc.strerror or exc}); {start}") from None
    not_rpc = (
        f"{endpoint} does not answer as a llama.cpp RPC server of protocol {PROTOCOL_MAJOR}.x "
        "(another program on that port, or a much older rpc-server?)"
    )
    with sock:
        try:
            # request: | command (1 byte) | size (8 bytes) | connection capabilities (none) |
            sock.sendall(struct.pack("<BQ", HELLO, CONN_CAPS_SIZE) + bytes(CONN_CAPS_SIZE))
            answer = _receive(sock, 8 + 4 + CONN_CAPS_SIZE)
        except OSError:
            raise RpcUnavailable(not_rpc) from None
    if answer is None:
        # an rpc-server serves one client at a time: the next one's connection is accepted by the
        # kernel and then waits, silent, until the first client leaves
        raise RpcUnavailable(
            f"{endpoint} accepted the connection but gave no answer within {timeout:g} s: an "
            "rpc-server busy with another client (it serves one at a time), or another program "
            "on that port"
        )
    size, major, minor, patch = struct.unpack_from("<QBBB", answer)
    if size != 4 + CONN_CAPS_SIZE:
        raise RpcUnavailable(not_rpc)
    if major != PROTOCOL_MAJOR or minor > PROTOCOL_MINOR:
        raise RpcUnavailable(
            f"the RPC server at {endpoint} speaks protocol {major}.{minor}.{patch} and this "
            f"build speaks {PROTOCOL_MAJOR}.{PROTOCOL_MINOR}: run the same llama.cpp version on "
            "both sides (the same ollama-spec install, or a matching llama.cpp rpc-server)"
        )
    return major, minor, patch


def _start_hint(endpoint: Endpoint) -> str:
    """How to get a server there: on this machine, loopback needs no --host (nor an open port)."""
    if is_loopback(endpoint.host):
        return (
            f"start one with `ollama-spec rpc-server --port {endpoint.port}`, or forward the port from the "
            f"server's machine (ssh -L {endpoint.port}:127.0.0.1:{endpoint.port} gpu-box)"
        )
    return f"start one there with `ollama-spec rpc-server --host 0.0.0.0 --port {endpoint.port}`"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _receive(sock: socket.socket, n: int) -> bytes | None:
    """`n` bytes, zero-padded when the peer closes or stops early (the size check then says so);
    None when it said nothing at all before the timeout."""
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except TimeoutError:
            if not data:
                return None
            chunk = b""
        if not chunk:
            return data.ljust(n, b"\0")
        data += chunk
    return data


_registered: dict[Endpoint, tuple[int, ...]] = {}  # endpoint -> its device handles, for this process


def register(endpoints: tuple[Endpoint, ...]) -> None:
    """Probe each server and add its devices to ggml's registry (once per process)."""
    lib = ggml()
    _require_distinct(endpoints)
    # A server lost after the probe makes llama.cpp abort (no retry exists); its one line
    # "Remote RPC server crashed..." says why, and ggml would follow it with a gdb backtrace.
    if endpoints:
        os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    for endpoint in endpoints:
        if endpoint in _registered:
            continue
        probe(endpoint)
        add_server = _proc(lib, "ggml_backend_rpc_add_server", ctypes.c_void_p, ctypes.c_char_p)
        reg = add_server(str(endpoint).encode())
        if not reg:
            raise RpcUnavailable(f"the RPC server at {endpoint} offers no devices")
        lib.ggml_backend_register(reg)
        _registered[endpoint] = tuple(
            lib.ggml_backend_reg_dev_get(reg, i) for i in range(lib.ggml_backend_reg_dev_count(reg))
        )


def connect(endpoints: tuple[Endpoint, ...]) -> tuple[BackendDevice, ...]:
    """Register the servers; their devices, with memory as they report it."""
    register(endpoints)
    lib = ggml()
    return tuple(describe_device(lib, dev) for dev in device_handles(endpoints))


def device_handles(endpoints: tuple[Endpoint, ...]) -> tuple[int, ...]:
    """The registered devices of these servers, in order."""
    return tuple(dev for endpoint in endpoints for dev in _registered[endpoint])


def remote_devices(servers: tuple[str, ...]) -> tuple[Device, ...]:
    """These servers' devices (connecting to them) as the memory plan sees them."""
    if not servers:
        return ()
    return tuple(
        rpc_device(d.name, d.description, d.total, d.free) for d in connect(parse_endpoints(",".join(servers)))
    )


def any_registered() -> bool:
    return bool(_registered)


def _devices() -> list[tuple[int, BackendDevice]]:
    lib = ggml()
    handles = [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]
    return [(dev, describe_device(lib, dev)) for dev in handles]


def server_devices(names: tuple[str, ...]) -> tuple[int, ...]:
    """The devices `rpc-server --device` names (ggml matches names in any case), or its default;
    each at most once: a device lent twice is counted twice by clients, which then overfill it."""
    if not names:
        return default_server_devices()
    lib = ggml()
    handles: dict[int, str] = {}
    for name in names:
        dev = _device(lib, name)
        if dev in handles:
            raise InvalidSetting(f"--device {name}: {handles[dev]} is already named; lend each device once")
        handles[dev] = name
    return tuple(handles)


def serve(endpoint: Endpoint, devices: tuple[int, ...], threads: int, cache_dir: str | None) -> None:
    """Run llama.cpp's RPC server on these devices (server_devices) until the process is stopped."""
    lib = ggml()
    start = _proc(
        lib,
        "ggml_backend_rpc_start_server",
        None,
        ctypes.c_char_p,
        ctypes.c_char_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.POINTER(ctypes.c_void_p),
    )
    array = (ctypes.c_void_p * len(devices))(*devices)
    start(str(endpoint).encode(), cache_dir.encode() if cache_dir else None, threads, len(devices), array)
    # llama.cpp returns only when it could not listen (it has printed why)
    raise RpcUnavailable(f"the RPC server could not listen on {endpoint} (in use, or not an address of this machine?)")


def default_server_devices() -> tuple[int, ...]:
    """rpc-server's default: every GPU of this machine, else the CPU."""
    devices = _devices()
    gpus = [dev for dev, d in devices if d.type in ("gpu", "igpu")]
    return tuple(gpus or [dev for dev, d in devices if d.type == "cpu"][:1])


def _device(lib: ctypes.CDLL, name: str) -> int:
    dev = lib.ggml_backend_dev_by_name(name.encode())
    if not dev:
        names = ", ".join(d.name for _, d in _devices())
        raise InvalidSetting(f"--device {name}: no such device here (devices: {names})")
    return dev


def _proc(lib: ctypes.CDLL, name: str, result, *args):
    """A function of the RPC backend, found through ggml's registry as llama.cpp's own tools do."""
    reg = lib.ggml_backend_reg_by_name(b"RPC")
    address = lib.ggml_backend_reg_get_proc_address(reg, name.encode()) if reg else None
    if not address:
        raise RpcUnavailable(
            "this llama-cpp-python was built without llama.cpp's RPC backend: rebuild it with "
            "`make install` (in the ollama-spec checkout), or "
            'CMAKE_ARGS="-DGGML_RPC=ON" pip install --force-reinstall --no-cache-dir llama-cpp-python'
        )
    return ctypes.CFUNCTYPE(result, *args)(address)
