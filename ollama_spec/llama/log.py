"""llama.cpp's log, captured: every line is kept for the sizes and errors it tells (a load's own
error, the buffers it allocated), and shown on stderr only when asked (--verbose).

Importing this module routes llama.cpp's log here, before any model loads.
"""

from __future__ import annotations

import ctypes
import re
import sys
from collections import deque

import llama_cpp

_LOG_LINES: deque[str] = deque(maxlen=2000)
_VERBOSE = False
_LOGGED = 0  # lines ever logged, so a load can find the lines it caused


@llama_cpp.llama_log_callback
def _log_callback(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    global _LOGGED
    line = text.decode("utf-8", errors="replace")
    _LOG_LINES.append(line)
    _LOGGED += 1
    if _VERBOSE:
        print(line, end="", file=sys.stderr, flush=True)


llama_cpp.llama_log_set(_log_callback, ctypes.c_void_p(0))


def set_verbose(verbose: bool) -> None:
    """Show llama.cpp's own log on stderr (it is always recorded for `recent_log`)."""
    global _VERBOSE
    _VERBOSE = verbose


def is_verbose() -> bool:
    return _VERBOSE


def recent_log() -> list[str]:
    """llama.cpp's recent log lines (allocation sizes, warnings), oldest first."""
    return list(_LOG_LINES)


def clear_log() -> None:
    _LOG_LINES.clear()


def log_mark() -> int:
    """How many lines llama.cpp has logged so far: errors after it are the ones a call caused."""
    return _LOGGED


def last_error(mark: int) -> str | None:
    """The most telling error llama.cpp logged since `mark` ("unknown model architecture: ...")."""
    recent = list(_LOG_LINES)[max(len(_LOG_LINES) - (_LOGGED - mark), 0) :]
    errors = [line.strip() for line in recent if "error" in line.lower() or "failed" in line.lower()]
    specific = [line for line in errors if "error loading model" in line]
    line = (specific or errors or [None])[-1]
    return re.sub(r"^\w+: ", "", line) if line else None  # drop llama.cpp's function-name prefix
