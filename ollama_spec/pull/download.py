"""Download one blob into the store: resumable, verified by sha256 before it gets its final name."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from ollama_spec.errors import BlobError, PullError
from ollama_spec.pull.locks import blob_lock
from ollama_spec.pull.writer import Blob, StoreWriter

# Tries in a row without progress before a blob's download gives up, as Ollama's per-part
# maxRetries (6 tries in all); a try that received bytes starts the count again, so a link that drops every few GB
# still finishes a 40 GB blob. Each retry resumes where the last one stopped.
RETRIES = 6
BACKOFF = 1.0  # seconds, doubled after each try that made no progress
MAX_BACKOFF = 30.0  # also the cap on a server's Retry-After
MAX_REDIRECTS = 10  # as Ollama: a registry redirects once to its blob storage


class Cancelled(Exception):
    """Raised inside a download when the pull is being interrupted (Ctrl-C)."""


@dataclass(frozen=True)
class BlobProgress:
    """What a download tells its caller: bytes so far of one blob."""

    blob: Blob
    completed: int
    status: str


def http_client(timeout: float = 30.0) -> httpx.Client:
    """The client every registry request goes through: bounded redirects, no content decoding."""
    return httpx.Client(
        follow_redirects=True,
        max_redirects=MAX_REDIRECTS,
        timeout=httpx.Timeout(timeout, connect=10.0),
        headers={"Accept-Encoding": "identity", "User-Agent": "ollama-spec"},
    )


@contextmanager
def http_errors(url: str, what: str = "the registry") -> Iterator[None]:
    """Transport failures as one-line PullErrors that say what could not be reached."""
    try:
        yield
    except httpx.TooManyRedirects:
        raise PullError(f"{url}: too many redirects (more than {MAX_REDIRECTS}; a redirect loop?)") from None
    except httpx.ConnectError as exc:
        raise PullError(f"cannot reach {what} at {_origin(url)} ({_reason(exc)})") from None
    except httpx.TimeoutException:
        raise PullError(f"{what} at {_origin(url)} did not answer in time") from None
    except httpx.UnsupportedProtocol:
        raise PullError(f"{url}: unsupported URL") from None


def _origin(url: str) -> str:
    parsed = httpx.URL(url)
    return f"{parsed.scheme}://{parsed.netloc.decode()}"


def _reason(exc: Exception) -> str:
    text = str(exc).strip()
    return text.rsplit("] ", 1)[-1] if text else type(exc).__name__


class _Partial:
    """The partial file of one blob and the sha256 of what it holds so far."""

    def __init__(self, path: Path, size: int):
        self.path = path
        self.size = size
        self.sha = hashlib.sha256()
        self.offset = 0
        if path.exists() and path.stat().st_size > size:
            self.restart()  # longer than the blob: not ours to trust
        elif path.exists():
            with open(path, "rb") as f:  # resuming: hash what is already there
                while chunk := f.read(8 << 20):
                    self.sha.update(chunk)
                    self.offset += len(chunk)

    def restart(self) -> None:
        self.path.write_bytes(b"")
        self.sha = hashlib.sha256()
        self.offset = 0


def fetch_blob(
    client: httpx.Client,
    url: str,
    blob: Blob,
    writer: StoreWriter,
    progress: Callable[[BlobProgress], None],
    cancel: threading.Event,
    *,
    retries: int | None = None,
) -> Path | None:
    """Download `url` as `blob` into its partial file and check it; None when the store has it already.

    The partial file lives outside `blobs/` and resumes with a Range request after a dropped
    connection (here or in the next pull). It is returned only once its size and sha256 match;
    the caller moves it into `blobs/` when the whole model is verified. A per-blob lock makes a
    second pull of the same blob wait, then reuse the finished file.
    """
    if writer.has_blob(blob):
        progress(BlobProgress(blob, blob.size, "already present"))
        return None

    def stop() -> None:
        if cancel.is_set():
            raise Cancelled()

    def waiting() -> None:
        progress(BlobProgress(blob, 0, "waiting for another pull"))

    with blob_lock(writer.path, blob.hex, waiting=waiting, stop=stop):
        if writer.has_blob(blob):
            progress(BlobProgress(blob, blob.size, "already present"))
            return None
        with writer.writing():
            part = _Partial(writer.partial_path(blob), blob.size)
        try:
            with http_errors(url, "the blob storage"):
                _download(client, url, blob, part, writer, progress, cancel, RETRIES if retries is None else retries)
        finally:
            if part.offset == 0:
                part.path.unlink(missing_ok=True)  # nothing worth keeping for a resume
        if part.sha.hexdigest() != blob.hex:
            part.path.unlink(missing_ok=True)
            raise BlobError(
                f"blob {blob.digest} from {url} does not match its digest (got sha256:{part.sha.hexdigest()}); "
                "the download was deleted and the manifest not written"
            )
        progress(BlobProgress(blob, blob.size, "verified"))
        return part.path


def _download(client, url, blob, part, writer, progress, cancel, retries) -> None:
    delay, failures = BACKOFF, 0
    while True:
        before = part.offset
        try:
            _receive(client, url, blob, part, writer, progress, cancel)
            return
        except _Restart:
            continue
        except (httpx.TransportError, _Busy) as exc:
            if isinstance(exc, httpx.UnsupportedProtocol):
                raise
            if part.offset > before:
                delay, failures = BACKOFF, 0  # it was moving: only a stall in a row counts
            failures += 1
            if failures >= retries:
                if isinstance(exc, httpx.ConnectError) and part.offset == 0:
                    raise
                why = exc.message if isinstance(exc, _Busy) else _reason(exc)
                kept = (
                    "the partial download is kept: run the same pull again to resume"
                    if part.offset
                    else "run the same pull again later"
                )
                raise PullError(
                    f"the download of {blob.digest} from {_origin(url)} failed at {part.offset} of {blob.size} bytes "
                    f"after {failures} tries in a row ({why}); {kept}"
                ) from None
            wait = min(exc.retry_after, MAX_BACKOFF) if isinstance(exc, _Busy) and exc.retry_after else delay
            if cancel.wait(wait):  # Ctrl-C does not wait out a backoff
                raise Cancelled() from None
            delay = min(delay * 2, MAX_BACKOFF)


class _Busy(Exception):
    """The server answered 429 or 5xx: worth another try after a pause (Retry-After when it gives one)."""

    def __init__(self, message: str, retry_after: float | None):
        super().__init__(message)
        self.message, self.retry_after = message, retry_after


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After", "")
    return float(value) if value.strip().isdigit() else None


class _Restart(Exception):
    """The server cannot continue the partial file: start the blob over."""


def _receive(client, url, blob, part, writer, progress, cancel) -> None:
    headers = {"Range": f"bytes={part.offset}-"} if part.offset else {}
    if part.offset == blob.size:
        return
    with client.stream("GET", url, headers=headers) as response:
        status = response.status_code
        if status == 416:
            part.restart()
            raise _Restart()
        if status == 404:
            raise PullError(f"{url} answered 404: there is no blob {blob.digest} to download")
        if status == 429 or status >= 500:
            response.read()
            raise _Busy(f"HTTP {status}{_said(response)}", _retry_after(response))
        if status >= 400:
            response.read()
            raise PullError(f"{url} answered HTTP {status} for blob {blob.digest}{_said(response)}")
        if part.offset and (status != 206 or not _range_starts_at(response, part.offset)):
            part.restart()  # the server sent the whole blob, or another range: take it from the start
            if status == 206:
                raise _Restart()
        expected = blob.size - part.offset
        length = response.headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) != expected:
            raise PullError(
                f"{url} sends {int(length) + part.offset} bytes for blob {blob.digest} but the manifest says {blob.size}"
            )
        with writer.writing(), open(part.path, "ab") as f:
            for chunk in response.iter_raw():  # as it arrives: a drop loses nothing received
                if cancel.is_set():
                    raise Cancelled()
                if part.offset + len(chunk) > blob.size:
                    f.close()
                    part.path.unlink(missing_ok=True)
                    raise PullError(f"{url} sends more bytes for blob {blob.digest} than the manifest's {blob.size}")
                f.write(chunk)
                part.sha.update(chunk)
                part.offset += len(chunk)
                progress(BlobProgress(blob, part.offset, "downloading"))
    if part.offset != blob.size:
        # The server closed a response that looked complete to httpx (no Content-Length).
        raise httpx.RemoteProtocolError(f"the server closed the response after {part.offset} bytes")


def short_text(text: str, limit: int = 200) -> str:
    """A server's words on one line, cut to `limit` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[:limit] + "..."


def _said(response: httpx.Response) -> str:
    """The server's own words about an error, after a colon (nothing when it said nothing)."""
    text = short_text(response.text)
    return f": {text}" if text else ""


def _range_starts_at(response: httpx.Response, offset: int) -> bool:
    value = response.headers.get("Content-Range", "")
    return value.startswith(f"bytes {offset}-")
