"""How long a model stays loaded after its last request: `keep_alive` and OLLAMA_KEEP_ALIVE, read as
Ollama reads them (api.Duration, envconfig.KeepAlive): seconds as a number, a Go duration ("5m",
"1h30m"), 0 to unload now, anything negative to keep it forever (math.inf here). Every route reads a
request's keep_alive through `KeepAlive`, so that /api/embed refuses what /api/chat refuses."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any

from pydantic import BeforeValidator

from ollama_spec.errors import InvalidSetting

DEFAULT_KEEP_ALIVE = 300.0  # Ollama's 5m
FOREVER = math.inf
# Go's longest time.Duration (2^63-1 ns, about 292 years): Ollama keeps a model that long "forever", and a
# longer keep_alive (1e12, a 400-digit number) can mean nothing else; past it no expiry date can be written.
LONGEST = (2**63 - 1) / 1e9
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION = re.compile(r"([-+]?)(0|(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+)")
_SECONDS = re.compile(r"[-+]?\d+")


def parse_keep_alive(value: Any, *, bare_seconds: bool = True) -> float:
    """Seconds to stay loaded (FOREVER for a negative or huge value); InvalidSetting for anything else than
    a number or a duration. `bare_seconds`: text such as "300" is seconds, as OLLAMA_KEEP_ALIVE reads
    it; a request's keep_alive (api.Duration) refuses it as Go's time.ParseDuration does."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise InvalidSetting(f'unsupported type {type(value).__name__}: give seconds or a duration such as "5m"')
    if isinstance(value, str):
        seconds = _duration(value, bare_seconds)
    elif isinstance(value, float) and math.isnan(value):
        raise InvalidSetting('keep_alive: NaN is not a number of seconds; give seconds or a duration such as "5m"')
    else:
        seconds = value  # an int stays one: a 400-digit number compares, where float() would overflow
    return FOREVER if seconds < 0 or seconds > LONGEST else float(seconds)


def _duration(value: str, bare_seconds: bool) -> float:
    text = value.strip()
    match = _DURATION.fullmatch(text)
    if match is None:
        if _SECONDS.fullmatch(text):
            if bare_seconds:  # OLLAMA_KEEP_ALIVE=300: seconds
                return float(text)
            raise InvalidSetting(f'time: missing unit in duration "{value}"')  # Go's words
        raise InvalidSetting(f'time: invalid duration "{value}"')
    sign, body = match.groups()
    seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(body))
    return -seconds if sign == "-" else seconds


def _request_keep_alive(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return parse_keep_alive(value, bare_seconds=False)
    except InvalidSetting as exc:
        raise ValueError(str(exc)) from None  # pydantic turns a ValueError into the route's 400


# A request's keep_alive, as seconds (FOREVER, or None: the server's default), read as Ollama's api.Duration.
KeepAlive = Annotated[float | None, BeforeValidator(_request_keep_alive)]
