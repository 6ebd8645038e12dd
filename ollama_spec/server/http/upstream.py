"""In front of a running Ollama (`serve --upstream URL`): what ollama-spec does not serve goes to the
daemon unchanged, streams included, and a model the daemon holds is unloaded there before it loads here.

Clients keep one address: `/api/tags` lists ours first, then the daemon's (`merge_tags`), and every
other request the server does not answer itself is `forward`ed: method, path, query, body and headers
as they came (less Host and the hop-by-hop ones, those `Connection` names among them), the answer
relayed chunk by chunk as the daemon sends it, so NDJSON and SSE streams arrive as they are made. A
daemon that is down is a 502 with one line, in the shape of the API that was called; one that breaks
off an answer breaks off ours (`Relayed`).
"""

from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import time
from collections.abc import AsyncIterable, Mapping

import anyio
import httpx
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.types import Send

from ollama_spec.errors import InvalidModelName, UpstreamUnreachable, one_line
from ollama_spec.models.daemon import ollama_host, ollama_host_url  # noqa: F401 (cli/serve.py reads --upstream by it)
from ollama_spec.models.names import parse_model_name
from ollama_spec.pull.daemon import Daemon, probe_daemon
from ollama_spec.server.protocol.errors import error_response

log = logging.getLogger("ollama_spec.server")

# RFC 9110 §7.6.1's hop-by-hop fields, and what the client library sets for the new hop itself.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
        "content-length",
    }
)
PROBE_TIMEOUT = 2.0  # seconds for all of /api/tags or /api/ps: a daemon answers them in milliseconds
LIST_LIMIT = 2 << 20  # bytes of a daemon's list (~5,000 models); a longer one is left out, not merged
CONNECT_TIMEOUT = 5.0  # a forwarded request may then wait as long as the daemon takes (a model loading)
UNLOAD_WAIT = 15.0  # seconds to wait for the daemon to let go of a model it was asked to unload


class ListingFailed(Exception):
    """The daemon's /api/tags or /api/ps could not be read: why, in a few words."""


class Upstream:
    """The Ollama daemon at `base_url`, over one `httpx.AsyncClient` (close it with `aclose`). With
    `own_key` (the server has --api-key), a client's Authorization header is ours, not the daemon's:
    it is not passed on."""

    def __init__(self, base_url: str, client: httpx.AsyncClient | None = None, own_key: bool = False):
        self.base_url = base_url.rstrip("/")
        self.dropped = HOP_BY_HOP | {"authorization"} if own_key else HOP_BY_HOP
        self._client = client or httpx.AsyncClient(
            base_url=self.base_url, timeout=httpx.Timeout(None, connect=CONNECT_TIMEOUT)
        )

    async def tags(self) -> list[dict]:
        """The daemon's `/api/tags` models; [] (with a warning in the log) when it does not answer, or not
        in time, or with more than LIST_LIMIT bytes."""
        try:
            return await self._list("/api/tags")
        except ListingFailed as exc:
            log.warning("the Ollama daemon at %s did not list its models (%s)", self.base_url, exc)
            return []

    async def _list(self, path: str) -> list[dict]:
        """The `models` of the daemon's list at `path`, read whole within PROBE_TIMEOUT seconds (a
        trickle of bytes would defeat a timeout per read) and LIST_LIMIT bytes; else ListingFailed."""
        try:
            body = await asyncio.wait_for(self._read_list(path), PROBE_TIMEOUT)
            return await asyncio.to_thread(_models, body)
        except (httpx.HTTPError, ValueError, AttributeError, asyncio.TimeoutError) as exc:
            raise ListingFailed(_why(exc)) from exc

    async def _read_list(self, path: str) -> bytes:
        async with self._client.stream("GET", path, timeout=PROBE_TIMEOUT) as answer:
            answer.raise_for_status()
            body = bytearray()
            async for chunk in answer.aiter_bytes():
                body += chunk
                if len(body) > LIST_LIMIT:
                    raise ListingFailed(f"its answer is longer than {LIST_LIMIT >> 20} MiB")
        return bytes(body)

    async def forward(self, http_request: Request, body: bytes | AsyncIterable[bytes]) -> Response:
        """`http_request` sent on to the daemon with `body` (read already, or streamed on as it arrives: a
        blob's upload); the answer streamed back."""
        url = httpx.URL(path=http_request.url.path)
        if query := http_request.url.query:  # httpx writes an empty query as a bare "?"
            url = url.copy_with(query=query.encode())
        headers = one_hop_left_out(http_request.headers.raw, self.dropped)
        if not isinstance(body, bytes) and (length := http_request.headers.get("content-length")):
            headers.append((b"content-length", length.encode()))  # streamed on as sent, not re-chunked
        request = self._client.build_request(http_request.method, url, headers=headers, content=body)
        try:
            answer = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            message = f"the Ollama daemon at {self.base_url} does not answer ({_why(exc)})"
            log.warning("%s: %s %s not forwarded", message, http_request.method, http_request.url.path)
            return error_response(http_request.url.path, UpstreamUnreachable(one_line(message)))
        return Relayed(answer, self.base_url)

    async def unload_if_loaded(self, name: str) -> bool:
        """If the daemon holds `name` (its /api/ps), ask it to unload it (keep_alive 0) and wait until it
        has; True when it was held and is gone."""
        held = await self._held(name)
        if held is None:
            return False
        try:
            answer = await self._client.post("/api/generate", json={"model": held, "keep_alive": 0}, timeout=60)
            answer.raise_for_status()
        except httpx.HTTPError as exc:
            log.warning("the Ollama daemon at %s did not unload %s (%s)", self.base_url, held, _why(exc))
            return False
        log.info("asked the Ollama daemon at %s to unload %s", self.base_url, held)
        deadline = time.monotonic() + UNLOAD_WAIT
        while await self._held(name) is not None:  # its runner stops a moment after the answer
            if time.monotonic() > deadline:
                log.warning("the Ollama daemon at %s still holds %s after %.0f s", self.base_url, held, UNLOAD_WAIT)
                return False
            await asyncio.sleep(0.2)
        return True

    async def _held(self, name: str) -> str | None:
        """The name the daemon lists `name` under in /api/ps, or None (not held, or no answer)."""
        try:
            models = await self._list("/api/ps")
        except ListingFailed as exc:
            log.warning("the Ollama daemon at %s did not list its running models (%s)", self.base_url, exc)
            return None
        wanted = name_key(name)
        for model in models:
            listed = model.get("model") or model.get("name")
            if isinstance(listed, str) and name_key(listed) == wanted:
                return listed
        return None

    async def aclose(self) -> None:
        await self._client.aclose()


class Relayed(StreamingResponse):
    """The daemon's answer as it comes (still encoded: Content-Encoding is passed on with it). If the daemon
    breaks off mid-body, this answer ends without its last message: the ASGI server then closes the
    connection, so the client sees a body cut short (as behind Go's ReverseProxy), not a complete 200."""

    def __init__(self, answer: httpx.Response, base_url: str):
        super().__init__(answer.aiter_raw(), status_code=answer.status_code)
        self.raw_headers = one_hop_left_out(answer.headers.raw, HOP_BY_HOP)
        self.answer, self.base_url = answer, base_url

    async def stream_response(self, send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
            try:
                async for chunk in self.body_iterator:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except httpx.HTTPError as exc:  # the status line is out: all that is left is to stop short
                log.warning("the Ollama daemon at %s broke off an answer (%s)", self.base_url, _why(exc))
                return
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:  # also when our client hangs up: the daemon then stops generating for nobody
            with anyio.CancelScope(shield=True):
                await self.answer.aclose()


def _models(body: bytes) -> list[dict]:
    """The `models` of a daemon's list. Run in a thread: json's C parser holds the GIL all the same, so
    LIST_LIMIT is what keeps that short (2 MiB: ~40 ms); the rest lets the event loop in."""
    models = json.loads(body).get("models")
    return [m for m in models if isinstance(m, dict)] if isinstance(models, list) else []


def one_hop_left_out(headers: list[tuple[bytes, bytes]], dropped: frozenset[str]) -> list[tuple[bytes, bytes]]:
    """`headers` less those for this hop alone: `dropped` and any the Connection header names (RFC 9110
    §7.6.1), so a header one side meant for us never reaches the other."""
    named = {
        token.strip().lower() for key, value in headers if key.lower() == b"connection" for token in value.split(b",")
    }
    return [(k, v) for k, v in headers if k.decode("latin-1").lower() not in dropped and k.lower() not in named]


def merge_tags(ours: list[dict], theirs: list[dict]) -> list[dict]:
    """Our /api/tags models first, then the daemon's that we do not list (names compared as Ollama's)."""
    seen = {name_key(tag_name(m)) for m in ours}
    merged = list(ours)
    for model in theirs:
        key = name_key(tag_name(model))
        if key not in seen:
            seen.add(key)
            merged.append(model)
    return merged


def name_key(name: str) -> tuple[str, ...]:
    """A model name compared as Ollama compares it: defaults filled in, case folded."""
    try:
        return tuple(part.lower() for part in parse_model_name(name).manifest_parts)
    except InvalidModelName:
        return (name.strip().lower(),)


def tag_name(model: Mapping) -> str:
    """An /api/tags entry's name ("" when it has none)."""
    name = model.get("name") or model.get("model")
    return name if isinstance(name, str) else ""


def default_upstream(own_host: str, own_port: int, environ: Mapping[str, str] | None = None) -> str | None:
    """The daemon `serve` puts itself in front of by default: OLLAMA_HOST (as Ollama reads it) when an
    Ollama daemon answers there and it is not this server's own address; else None."""
    url = ollama_host(environ=environ)
    if is_own_address(url, own_host, own_port):
        return None
    return url if probe_daemon(url) is Daemon.OLLAMA else None  # another ollama-spec: no forwarding loops


def is_own_address(url: str, own_host: str, own_port: int) -> bool:
    """Whether `url` reaches a server bound to `own_host`:`own_port` on this machine."""
    parsed = httpx.URL(url)
    if parsed.port != own_port:
        return False
    host, own = parsed.host.strip("[]").lower(), own_host.strip("[]").lower()
    return host == own or (_local(host) and _local(own))


def _local(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    return address.is_loopback or address.is_unspecified


def _why(exc: Exception) -> str:
    if isinstance(exc, (httpx.TimeoutException, asyncio.TimeoutError)):
        return "no answer in time"
    if isinstance(exc, httpx.ConnectError):
        return "nothing answers there"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"HTTP {exc.response.status_code}"
    return one_line(str(exc)) or type(exc).__name__
