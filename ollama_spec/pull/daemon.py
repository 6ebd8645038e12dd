"""Through a running Ollama daemon: its own `/api/pull`, progress passed through as it streams.

Who answers at OLLAMA_HOST is asked with models/daemon's probe, as `check` and `doctor` ask it.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

import httpx
import ollama

from ollama_spec.errors import PullError
from ollama_spec.models.daemon import daemon_status, is_ollama_spec
from ollama_spec.pull.progress import PullEvent


class Daemon(Enum):
    """What answers at OLLAMA_HOST."""

    NONE = "none"
    OLLAMA = "ollama"
    # `ollama-spec serve`, which front-ends reach through OLLAMA_HOST too: its /api/pull answers
    # success for every name (the loaded pair answers them all) and downloads nothing.
    OLLAMA_SPEC = "ollama-spec"


def probe_daemon(host: str) -> Daemon:
    """Who answers at `host` (a quick probe): Ollama, ollama-spec's server, or nobody. One that answers
    with an error is still a daemon to talk to (and to report)."""
    if not daemon_status(host).answered:
        return Daemon.NONE
    return Daemon.OLLAMA_SPEC if is_ollama_spec(host) else Daemon.OLLAMA


def pull_through_daemon(name: str, host: str, insecure: bool, report: Callable[[PullEvent], None]) -> None:
    """`ollama pull name` through the daemon at `host`; its error messages become PullErrors as they are."""
    client = ollama.Client(host=host)
    if is_ollama_spec(host):
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
