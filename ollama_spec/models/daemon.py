"""Is an Ollama daemon running, and which models does it hold in (GPU) memory?

A running Ollama keeps models loaded for minutes after their last request (`keep_alive`, 5 min
by default), and that GPU memory is gone for ollama-spec. `check` and `doctor` ask `/api/ps`
so a short GPU can be explained and freed; `pull` asks the same to learn whether a daemon can
pull for it (`answered`), and `is_ollama_spec` whether that is ollama-spec's own server. Never
raises: no daemon is a normal state.

Where the daemon is, is read here alone (`ollama_host`): `serve --upstream`, `pull`, `check`, `doctor`,
`ps` and `stop` all reach the URL Ollama's own client would for the same OLLAMA_HOST.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

import httpx
import ollama

from ollama_spec.config import ollama_var

PROBE_TIMEOUT = 2.0  # seconds: a daemon answers in milliseconds on this machine, in tens across a LAN
DEFAULT_PORT = "11434"


def ollama_host(host: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The Ollama daemon's URL: `host` (a --host) when given, else $OLLAMA_HOST, read by `ollama_host_url`.
    ollama-python reads OLLAMA_HOST raw and its own way ("::1", "host:notaport" raise): never hand it that."""
    return ollama_host_url(host or ollama_var("OLLAMA_HOST", environ))


def ollama_host_url(value: str) -> str:
    """OLLAMA_HOST as Ollama's envconfig.Host() reads it: scheme http unless given, port 11434 unless
    given (80/443 with an explicit http/https), `ollama.com` over https; e.g. `0.0.0.0` ->
    `http://0.0.0.0:11434` (Go dials it as this machine), `:8080` -> `http://127.0.0.1:8080`."""
    text = value.strip().strip("\"'").strip()
    scheme, sep, hostport = text.partition("://")
    default_port = DEFAULT_PORT
    if not sep:
        scheme, hostport = ("https", "ollama.com:443") if text == "ollama.com" else ("http", text)
    elif scheme in ("http", "https"):
        default_port = "80" if scheme == "http" else "443"
    hostport, _, path = hostport.partition("/")
    split = _split_host_port(hostport)
    if split is None:
        host, port = "127.0.0.1", default_port
        try:
            host = str(ipaddress.ip_address(hostport.strip("[]")))
        except ValueError:
            host = hostport or host
    else:
        host, port = split
    if not (port.isascii() and port.isdigit() and int(port) <= 65535):
        port = default_port
    host = host or "127.0.0.1"  # Go dials ":8080" as the local machine
    joined = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{scheme}://{joined}" + (f"/{path}" if path else "")


def _split_host_port(hostport: str) -> tuple[str, str] | None:
    """Go's net.SplitHostPort: `host:port` or `[v6]:port`; None where it fails (no port, bare IPv6)."""
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0 or hostport[end + 1 : end + 2] != ":":
            return None
        return hostport[1:end], hostport[end + 2 :]
    host, sep, port = hostport.rpartition(":")
    return None if not sep or ":" in host else (host, port)


@dataclass(frozen=True)
class HeldModel:
    """A model the daemon has loaded: `size` in all, `size_vram` of it on GPUs (bytes)."""

    name: str
    size: int
    size_vram: int

    def to_json(self) -> dict:
        return {"name": self.name, "size": self.size, "size_vram": self.size_vram}


@dataclass(frozen=True)
class DaemonStatus:
    host: str
    reachable: bool
    models: tuple[HeldModel, ...] = ()
    error: str | None = None  # why it is not reachable, in words
    answered: bool = False  # something speaking HTTP answered, if only with an error status: a daemon is there

    @property
    def vram_held(self) -> int:
        return sum(m.size_vram for m in self.models)

    def to_json(self) -> dict:
        return {
            "host": self.host,
            "reachable": self.reachable,
            "models": [m.to_json() for m in self.models],
            "vram_held": self.vram_held,
            "error": self.error,
        }


def daemon_status(host: str | None = None, timeout: float = PROBE_TIMEOUT) -> DaemonStatus:
    """Ask the daemon at `host` (default: $OLLAMA_HOST as Ollama reads it, else 127.0.0.1:11434) what it holds."""
    where = ollama_host(host)
    client = ollama.Client(host=where, timeout=timeout)
    try:
        response = client.ps()
    except (ConnectionError, httpx.HTTPError) as exc:
        return DaemonStatus(where, False, error=_why(exc))
    except ollama.ResponseError as exc:
        detail = f": {exc.error}" if exc.error else ""
        return DaemonStatus(
            where, False, error=f"it answered /api/ps with HTTP {exc.status_code}{detail}", answered=True
        )
    except ValueError:  # not JSON, or not Ollama's: something else listens there
        return DaemonStatus(where, False, error="it answered /api/ps with something other than Ollama's JSON")
    models = tuple(
        HeldModel(m.model or m.name or "?", int(m.size or 0), int(m.size_vram or 0)) for m in response.models
    )
    return DaemonStatus(where, True, models, answered=True)


def is_ollama_spec(host: str, timeout: float = PROBE_TIMEOUT) -> bool:
    """Whether ollama-spec's own server answers at `host`: it names itself in /api/version, Ollama gives
    only its version."""
    client = ollama.Client(host=host, timeout=timeout)
    try:
        # the ollama package has no call for /api/version; its httpx client already knows the host's URL
        answer = client._client.get("/api/version")
        return answer.status_code == 200 and "ollama_spec" in answer.json()
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def freeing_advice(status: DaemonStatus) -> list[str]:
    """What the daemon holds on the GPU and the commands that free it (empty when it holds nothing there)."""
    from ollama_spec.models.gguf_info import format_bytes

    held = [m for m in status.models if m.size_vram]
    if not held:
        return []
    listed = ", ".join(f"{m.name} ({format_bytes(m.size_vram)})" for m in held)
    lines = [f"Ollama at {status.host} holds {format_bytes(status.vram_held)} of GPU memory: {listed}"]
    lines += [f"free it with: ollama stop {m.name}" for m in held]
    lines.append(
        "or let Ollama unload models right after each request: OLLAMA_KEEP_ALIVE=0 (or keep_alive: 0 in the request)"
    )
    return lines


def _why(exc: Exception) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time"
    if isinstance(exc, (ConnectionError, httpx.ConnectError)):
        return "nothing answers there; start it with 'ollama serve'"
    return str(exc) or type(exc).__name__
