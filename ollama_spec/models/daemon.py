"""Is an Ollama daemon running, and which models does it hold in (GPU) memory?

A running Ollama keeps models loaded for minutes after their last request (`keep_alive`, 5 min
by default), and that GPU memory is gone for ollama-spec. `check` and `doctor` ask `/api/ps`
so a short GPU can be explained and freed; `pull` asks the same to learn whether a daemon can
pull for it (`answered`), and `is_ollama_spec` whether that is ollama-spec's own server. Never
raises: no daemon is a normal state.
"""

from __future__ import annotations

from dataclasses import dataclass

import httpx
import ollama

from ollama_spec.config import ollama_var

PROBE_TIMEOUT = 2.0  # seconds: a daemon answers in milliseconds on this machine, in tens across a LAN


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
    # ollama-python reads OLLAMA_HOST raw; Ollama trims spaces and quotes first
    client = ollama.Client(host=host or ollama_var("OLLAMA_HOST") or None, timeout=timeout)
    where = str(client._client.base_url).rstrip("/")  # the client's own reading of OLLAMA_HOST
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
