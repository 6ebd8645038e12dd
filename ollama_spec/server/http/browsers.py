"""What a web page may ask of the server, as Ollama decides it (server/routes.go, envconfig in ollama/ollama).

Two guards, both before the API key, so that a page learns nothing either way:
- **Host** (DNS rebinding): bound to loopback, a request whose Host is not this machine's
  (localhost, its hostname, `*.localhost`/`*.local`/`*.internal`, a loopback, private, unspecified
  or local-interface address) is a 403. A rebinding page is same-origin with `127.0.0.1:PORT`, so
  only the Host it sends gives it away.
- **Origin** (cross-site requests): a request with an Origin that is neither this server's own
  nor an allowed one is a 403 and runs nothing, whatever its Content-Type (a page may POST
  `text/plain` without a preflight). The allowed origins are OLLAMA_ORIGINS plus Ollama's
  defaults: localhost/127.0.0.1/0.0.0.0 on any port, and desktop or editor apps.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterable

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

# Ollama's AllowedOrigins() beyond OLLAMA_ORIGINS; [::1] too, the IPv6 spelling of the same pages.
DEFAULT_ORIGINS = (
    *(
        f"{scheme}://{host}{port}"
        for host in ("localhost", "127.0.0.1", "0.0.0.0", "[::1]")
        for scheme in ("http", "https")
        for port in ("", ":*")
    ),
    "app://*",
    "file://*",
    "tauri://*",
    "vscode-webview://*",
    "vscode-file://*",
)
LOCAL_SUFFIXES = (".localhost", ".local", ".internal")


def origin_pattern(extra: Iterable[str] = ()) -> re.Pattern[str]:
    """One regex for the allowed origins: OLLAMA_ORIGINS entries (`*` alone: any origin; one `*` in
    an entry: any text there, as gin's cors reads wildcards) and the defaults."""
    entries = [e.strip().lower() for e in extra if e.strip()]
    if "*" in entries:
        return re.compile(r".*", re.DOTALL)
    alternatives = [
        ".*".join(re.escape(part) for part in entry.split("*", 1)) for entry in (*entries, *DEFAULT_ORIGINS)
    ]
    return re.compile("|".join(alternatives))


def is_loopback_bind(host: str) -> bool:
    """Whether the server listens on loopback only (then the Host header is checked, as Ollama does)."""
    if host.strip("[]").lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The Host header without its port (and an IPv6 address without its brackets), lowercased."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    name, colon, port = header.rpartition(":")
    return name if colon and port.isdigit() and ":" not in name else header


def _local_addresses() -> set[str]:
    try:
        import psutil

        return {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    except Exception:  # noqa: BLE001 - without the list, loopback and private addresses still pass
        return set()


def allowed_host(header: str, local_addresses: set[str] | None = None) -> bool:
    """Ollama's allowedHostsMiddleware: is `header` (a Host header) a name for this machine?"""
    host = _host_name(header)
    if host in ("", "localhost") or host == socket.gethostname().lower() or host.endswith(LOCAL_SUFFIXES):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if address.is_loopback or address.is_private or address.is_unspecified:
        return True
    return host in (local_addresses if local_addresses is not None else _local_addresses())


class BrowserGuard:
    """403 (empty, as Ollama answers) for a foreign Host when bound to loopback, and for an Origin
    that may not call us; everything else goes on to the app."""

    def __init__(self, app: ASGIApp, origins: re.Pattern[str], check_host: bool):
        self.app, self.origins, self.check_host = app, origins, check_host

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.allowed(scope):
            return await Response(status_code=403)(scope, receive, send)
        await self.app(scope, receive, send)

    def allowed(self, scope: Scope) -> bool:
        headers = {k.decode(): v.decode("latin-1") for k, v in scope["headers"] if k in (b"host", b"origin")}
        host, origin = headers.get("host", ""), headers.get("origin")
        # gin's cors: a page of this very server (same scheme and Host) is no cross-site request
        if origin and origin not in (f"http://{host}", f"https://{host}") and not self.origins.fullmatch(origin):
            return False
        return not self.check_host or allowed_host(host)
