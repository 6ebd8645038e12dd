"""How long a model stays loaded after its last request: `keep_alive` and OLLAMA_KEEP_ALIVE, read as
Ollama reads them (api.Duration, envconfig.KeepAlive): seconds as a number, a Go duration ("5m",
"1h30m"), 0 to unload now, anything negative to keep it forever (math.inf here)."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from ollama_spec.config import ollama_var
from ollama_spec.errors import InvalidSetting

DEFAULT_KEEP_ALIVE = 300.0  # Ollama's 5m
FOREVER = math.inf
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_DURATION = re.compile(r"([-+]?)(0|(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ns|us|µs|μs|ms|s|m|h))+)")


def parse_keep_alive(value: float | str) -> float:
    """Seconds to stay loaded (FOREVER for a negative value); InvalidSetting for text that is not a duration."""
    if isinstance(value, bool):
        raise InvalidSetting(f'keep_alive: give seconds or a duration such as "5m", got {value}')
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        text = value.strip()
        match = _DURATION.fullmatch(text)
        if match is None:
            if re.fullmatch(r"[-+]?\d+", text):  # OLLAMA_KEEP_ALIVE=300: seconds
                seconds = float(text)
            else:
                raise InvalidSetting(f'time: invalid duration "{value}"')  # Go's words
        else:
            sign, body = match.groups()
            seconds = sum(float(n) * _UNITS[unit] for n, unit in _PART.findall(body))
            seconds = -seconds if sign == "-" else seconds
    return FOREVER if seconds < 0 or math.isinf(seconds) else seconds


def default_keep_alive(environ: Mapping[str, str] | None = None) -> float:
    """OLLAMA_KEEP_ALIVE, else 5 minutes; a value Ollama could not read leaves the default, as Ollama does."""
    text = ollama_var("OLLAMA_KEEP_ALIVE", environ)
    if not text:
        return DEFAULT_KEEP_ALIVE
    try:
        return parse_keep_alive(text)
    except InvalidSetting:
        return DEFAULT_KEEP_ALIVE
