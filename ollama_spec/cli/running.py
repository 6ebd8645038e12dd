"""`ollama-spec ps` and `ollama-spec stop`: what a running `serve` holds, and unloading one model, as
Ollama's own commands do (GET /api/ps; POST /api/generate with keep_alive 0)."""

from __future__ import annotations

import math
from datetime import datetime, timezone

import click

from ollama_spec.models.daemon import ollama_host
from ollama_spec.models.gguf_info import format_bytes

PADDING = "    "  # Ollama's table: no borders, columns four spaces apart

host_option = click.option(
    "--host",
    default=None,
    help="The server to ask (default: $OLLAMA_HOST as Ollama reads it, else 127.0.0.1:11434).",
)


def _client(host: str | None):
    import ollama

    return ollama.Client(host=ollama_host(host), timeout=600)._client


def _call(host: str | None, method: str, path: str, **kwargs) -> dict:
    import httpx

    client = _client(host)
    try:
        answer = client.request(method, path, **kwargs)
    except httpx.HTTPError as exc:
        raise click.ClickException(
            f"could not reach the server at {client.base_url}: {exc}; check that `ollama-spec serve` is "
            "running there (or give --host)"
        ) from None
    try:
        body = answer.json()
    except ValueError:
        body = {}
    if answer.status_code >= 400:
        error = body.get("error") if isinstance(body, dict) else None
        message = error.get("message") if isinstance(error, dict) else error
        raise click.ClickException(str(message or f"{answer.status_code} {answer.reason_phrase}"))
    return body if isinstance(body, dict) else {}


def processor(size: int, size_vram: int) -> str:
    """Where a model runs, as `ollama ps` says it."""
    if size_vram == 0:
        return "100% CPU"
    if size_vram == size:
        return "100% GPU"
    if size_vram > size or size == 0:
        return "Unknown"
    cpu = round((size - size_vram) / size * 100)
    return f"{cpu}%/{100 - cpu}% CPU/GPU"


def until(expires_at: str, now: datetime | None = None) -> str:
    """'4 minutes from now', 'Forever' (Ollama: "Never"), or 'Stopping...' once past."""
    try:
        moment = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    except ValueError:
        return expires_at
    now = now or datetime.now(timezone.utc)
    seconds = (moment - now).total_seconds()
    if seconds <= 0:
        return "Stopping..."
    if moment.year >= 2099:
        return "Forever"
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds >= size or unit == "second":
            count = max(1, math.floor(seconds / size))
            return f"{count} {unit}{'' if count == 1 else 's'} from now"
    return ""


def table(rows: list[list[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(PADDING.join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows)


@click.command()
@click.argument("model", required=False)
@host_option
def ps(model, host) -> None:
    """List the models a running serve holds in memory, as `ollama ps` does, with their drafts.

    \b
    Examples:
      ollama-spec ps
      OLLAMA_HOST=127.0.0.1:8000 ollama-spec ps llama3
    """
    rows = [["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL", "DRAFT"]]
    for entry in _call(host, "GET", "/api/ps").get("models", []):
        if model and not entry.get("name", "").startswith(model):
            continue
        size, vram = int(entry.get("size", 0)), int(entry.get("size_vram", 0))
        draft = (entry.get("draft") or {}).get("model") or "-"
        rows.append(
            [
                entry.get("name", ""),
                entry.get("digest", "")[:12],
                format_bytes(size),
                processor(size, vram),
                str(entry.get("context_length", "")),
                until(entry.get("expires_at", "")),
                draft,
            ]
        )
    click.echo(table(rows))


@click.command()
@click.argument("model")
@host_option
def stop(model, host) -> None:
    """Unload MODEL from a running serve now, as `ollama stop` does.

    \b
    Examples:
      ollama-spec stop llama3.1:70b
    """
    try:
        _call(host, "POST", "/api/generate", json={"model": model, "keep_alive": 0, "stream": False})
    except click.ClickException as exc:
        if "not found" in exc.message:
            raise click.ClickException(f'couldn\'t find model "{model}" to stop') from None  # Ollama's words
        raise
