"""Through a running Ollama daemon: its own `/api/pull`, progress passed through as it streams."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import httpx
import ollama

from ollama_spec.errors import PullError
from ollama_spec.pull.progress import PullEvent

PROBE_TIMEOUT = 2.0


class Daemon(Enum):
    """What answers at OLLAMA_HOST."""

    NONE = "none"
    OLLAMA = "ollama"
    # `ollama-spec serve`, which front-ends reach through OLLAMA_HOST too: its /api/pull answers
    # success for every name (the loaded pair answers them all) and downloads nothing.
    OLLAMA_SPEC = "ollama-spec"


def probe_daemon(host: str) -> Daemon:
    """Who answers Ollama's `/api/tags` at `host` (a quick probe): Ollama, ollama-spec's server, or nobody."""
    client = ollama.Client(host=host, timeout=PROBE_TIMEOUT)
    try:
        client.list()
    except (ConnectionError, httpx.HTTPError, ValueError):
        return Daemon.NONE
    except ollama.ResponseError:
        return Daemon.OLLAMA  # it answered, with an error: still a daemon to talk to (and to report)
    return Daemon.OLLAMA_SPEC if _is_ollama_spec(client) else Daemon.OLLAMA


def _is_ollama_spec(client: ollama.Client) -> bool:
    """ollama-spec's server names itself in /api/version; Ollama's gives only its version."""
    try:
        # the ollama package has no call for /api/version; its httpx client already knows the host's URL
        answer = client._client.get("/api/version")
        return answer.status_code == 200 and "ollama_spec" in answer.json()
    except (httpx.HTTPError, ValueError, AttributeError):
        return False


def daemon_answers(host: str) -> bool:
    """True when a real Ollama daemon answers at `host`."""
    return probe_daemon(host) is Daemon.OLLAMA


def pull_through_daemon(name: str, host: str, insecure: bool, report: Callable[[PullEvent], None]) -> None:
    """`ollama pull name` through the daemon at `host`; its error messages become PullErrors as they are."""
    client = ollama.Client(host=host)
    if _is_ollama_spec(client):
        raise PullError(
            f"{host} is an ollama-spec server, not the Ollama daemon: it cannot pull models; "
            "pull straight from the registry instead (--via registry)"
        )
    last = None
    try:
        for part in client.pull(name, insecure=insecure, stream=True):
            last = part.status
            report(PullEvent(name, part.status or "", part.digest or None, part.total, part.completed))
    except ollama.ResponseError as exc:
        raise PullError(f"the Ollama daemon at {host} says: {exc.error}") from None
    except (ConnectionError, httpx.ConnectError):
        raise PullError(
            f"cannot reach the Ollama daemon at {host}; start it with 'ollama serve', set OLLAMA_HOST, "
            "or pull without it (--via registry)"
        ) from None
    except httpx.HTTPError as exc:
        raise PullError(f"the connection to the Ollama daemon at {host} failed during the pull ({exc})") from None
    if last != "success":
        raise PullError(f"the Ollama daemon at {host} ended the pull of {name} without success (last status: {last!r})")
