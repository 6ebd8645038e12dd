"""Through a running Ollama daemon: its own `/api/pull`, progress passed through as it streams."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import ollama

from ..errors import PullError
from .progress import PullEvent

PROBE_TIMEOUT = 2.0


def daemon_answers(host: str) -> bool:
    """True when something answers Ollama's `/api/tags` at `host` (a quick probe)."""
    try:
        ollama.Client(host=host, timeout=PROBE_TIMEOUT).list()
    except (ConnectionError, httpx.HTTPError, ValueError):
        return False
    except ollama.ResponseError:
        return True  # it answered, with an error: still a daemon to talk to (and to report)
    return True


def pull_through_daemon(name: str, host: str, insecure: bool, report: Callable[[PullEvent], None]) -> None:
    """`ollama pull name` through the daemon at `host`; its error messages become PullErrors as they are."""
    client = ollama.Client(host=host)
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
