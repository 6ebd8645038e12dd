"""`rpc-server`: lend this machine's devices to another machine's ollama-spec (or llama.cpp) over RPC."""

from __future__ import annotations

import errno
import os
import signal
import socket
from pathlib import Path

import click

from ollama_spec.errors import InvalidSetting, RpcUnavailable
from ollama_spec.llama.rpc import DEFAULT_PORT, IPV4_ONLY, SECURITY_NOTE, Endpoint, ipv4_address, is_ipv6, is_loopback


@click.command("rpc-server")
@click.option(
    "--host",
    default="127.0.0.1",
    show_default=True,
    help="Address to listen on. 0.0.0.0 lets other machines in: only on a trusted network.",
)
@click.option("--port", "-p", type=click.IntRange(1, 65535), default=DEFAULT_PORT, show_default=True)
@click.option(
    "--device",
    "-d",
    "devices",
    multiple=True,
    metavar="NAME[,NAME...]",
    help="Devices to lend, as `ollama-spec doctor` names them (CUDA0, CPU...). Default: every GPU, else the CPU.",
)
# --threads only: -t is --temperature in every other command
@click.option("--threads", type=click.IntRange(min=1), help="CPU threads for a CPU device (default: all cores).")
@click.option(
    "--cache",
    "-c",
    is_flag=True,
    help="Keep received tensors on disk ($LLAMA_CACHE or ~/.cache/llama.cpp/rpc), so that loading the same "
    "model again sends only hashes.",
)
def rpc_server(host: str, port: int, devices: tuple[str, ...], threads: int | None, cache: bool) -> None:
    """Serve this machine's GPUs (or CPU) to a target model loaded on another machine.

    Runs llama.cpp's RPC server from the same llama.cpp build ollama-spec uses. On the machine
    with the draft, `--rpc HOST:PORT` (generate, chat, serve, bench, check) then puts target
    layers on this machine's devices as well as its own. Stop it with Ctrl-C.

    The RPC protocol has no authentication and no encryption: whoever reaches the port can use
    these devices. It listens on 127.0.0.1 unless told otherwise; open it only on a trusted
    network (or through an SSH tunnel: ssh -L 50052:127.0.0.1:50052 gpu-box).

    It serves one client at a time: a second machine (or process) that connects waits until the
    first one disconnects. --host takes an IPv4 address or a host name (llama.cpp's RPC has no IPv6).

    \b
    Examples:
      ollama-spec rpc-server                               # this machine only (tests, SSH tunnels)
      ollama-spec rpc-server --host 0.0.0.0 --port 50052   # on the second GPU machine, trusted LAN
      ollama-spec rpc-server --host 0.0.0.0 -d CUDA0,CUDA1 --cache
      # then, on the first machine:
      ollama-spec generate llama3.1:70b --draft llama3.2:1b --rpc 192.168.1.20:50052 "Hello"
    """
    from ollama_spec.llama import rpc
    from ollama_spec.llama.load_params import default_threads

    endpoint = Endpoint(_listen_address(host), port)
    _require_free(endpoint)
    names = tuple(name.strip() for item in devices for name in item.split(",") if name.strip())
    lent = rpc.server_devices(names)  # before the line that says it is serving
    if not is_loopback(endpoint.host):
        click.secho(f"warning: listening on {host}: {SECURITY_NOTE}", fg="yellow", err=True)
    cache_dir = _cache_dir() if cache else None
    click.echo(
        f"ollama-spec rpc-server on {endpoint}; use it with --rpc {_reachable(endpoint.host)}:{port} (Ctrl-C stops it)",
        err=True,
    )
    # llama.cpp's server blocks in C until the process ends: let Ctrl-C and SIGTERM end it directly.
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    rpc.serve(endpoint, lent, threads or default_threads(), cache_dir)


def _listen_address(host: str) -> str:
    """--host as the IPv4 address llama.cpp's server binds (it takes inet_addr's dotted form only:
    "localhost" would fail there with a bare "Invalid host address")."""
    host = host.strip()
    if is_ipv6(host, host):
        raise InvalidSetting(f"--host {host}: {IPV4_ONLY} (0.0.0.0 listens on every IPv4 address)")
    if not host:  # gethostbyname("") is 0.0.0.0: every address, which must be asked for by name
        raise InvalidSetting("--host is empty: give an address (127.0.0.1, or 0.0.0.0 for every address)")
    try:
        return ipv4_address(host)
    except OSError:
        raise InvalidSetting(f"--host {host}: not an address of this machine") from None


def _require_free(endpoint: Endpoint) -> None:
    """A clear error before llama.cpp prints its banner and then fails to listen."""
    try:
        infos = socket.getaddrinfo(endpoint.host, endpoint.port, type=socket.SOCK_STREAM)
    except socket.gaierror:
        raise InvalidSetting(f"--host {endpoint.host}: not an address of this machine") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise RpcUnavailable(
                    f"port {endpoint.port} on {endpoint.host} is in use (another rpc-server?): pick another with --port"
                ) from None
            raise InvalidSetting(f"cannot listen on {endpoint}: {exc.strerror or exc}") from None


def _reachable(host: str) -> str:
    return socket.gethostname() if host == "0.0.0.0" else host


def _cache_dir() -> str:
    base = (
        os.environ.get("LLAMA_CACHE") or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "llama.cpp"
    )
    path = Path(base) / "rpc"
    path.mkdir(parents=True, exist_ok=True)
    return str(path)
