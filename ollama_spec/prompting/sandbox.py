"""Chat templates rendered in a child process, bounded in time, memory and output size.

A chat template is code from the model file (a pulled GGUF, a Modelfile's TEMPLATE): Jinja's
sandbox keeps it from reaching the machine, but not from looping for hours or doubling a string
until the kernel kills us. So templates render in one long-lived child process that imports only
jinja2, under a CPU-free alarm and an address-space limit; a render past its time is stopped
there (and the child killed if it does not stop), and the caller gets a one-line error.

This file is also the child's program (`python -m ollama_spec.prompting.sandbox`): it imports
nothing of ollama_spec, so the child starts in a tenth of a second.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import struct
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar

DEFAULT_SECONDS = 5.0
DEFAULT_MAX_CHARS = 8 * 1024 * 1024  # a prompt of 256k tokens is about 1 MB of text
DEFAULT_MEMORY_MIB = 1024  # what a render may allocate beyond the child's own start
TIMEOUT_ENV = "OLLAMA_SPEC_TEMPLATE_TIMEOUT"
GRACE_SECONDS = 2.0  # the child's own alarm should stop a render; past this we kill it
_HEADER = struct.Struct("!I")


@dataclass(frozen=True)
class TemplateLimits:
    seconds: float = DEFAULT_SECONDS
    max_chars: int = DEFAULT_MAX_CHARS
    memory_mib: int = DEFAULT_MEMORY_MIB

    def __post_init__(self) -> None:
        if not self.seconds > 0:  # nan too
            raise ValueError(f"a template's time limit must be a positive number of seconds, got {self.seconds}")

    @classmethod
    def from_environment(cls) -> TemplateLimits:
        """The defaults, with the time limit from $OLLAMA_SPEC_TEMPLATE_TIMEOUT (seconds) when set."""
        given = os.environ.get(TIMEOUT_ENV, "").strip()
        if not given:
            return cls()
        try:
            return cls(seconds=float(given))
        except ValueError:
            raise ValueError(f"${TIMEOUT_ENV} must be a positive number of seconds, got '{given}'") from None


class TemplateFailed(Exception):
    """The template raised, or could not be parsed: `message` is its first line."""


class TemplateRefused(TemplateFailed):
    """The template's own raise_exception: it will not render this conversation as it is."""


class TemplateTooCostly(TemplateFailed):
    """The render ran past its time, its memory or its output size."""


class Sandbox:
    """One child process that renders templates, one at a time; restarted after a render it had to kill."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._child: subprocess.Popen | None = None

    def render(self, template: str, context: dict[str, Any], limits: TemplateLimits) -> str:
        """`template` rendered with `context` (JSON values); TemplateFailed and its kinds on failure."""
        request = json.dumps(
            {"template": template, "context": context, "seconds": limits.seconds, "max_chars": limits.max_chars}
        ).encode()
        with self._lock:
            child = self._started(limits)
            try:
                _send(child.stdin, request)
                answer = _receive(child.stdout, limits.seconds + GRACE_SECONDS)
            except (OSError, EOFError, TimeoutError) as exc:
                self._kill()
                if isinstance(exc, TimeoutError):
                    raise TemplateTooCostly(f"took longer than {limits.seconds:g} s to render") from None
                raise TemplateTooCostly(
                    f"stopped the renderer (more than {limits.memory_mib} MiB, or a crash)"
                ) from None
        kind, text = answer["kind"], answer["text"]
        if kind == "ok":
            return text
        raise {"refused": TemplateRefused, "costly": TemplateTooCostly}.get(kind, TemplateFailed)(text)

    def close(self) -> None:
        with self._lock:
            self._kill()

    def _started(self, limits: TemplateLimits) -> subprocess.Popen:
        if self._child is not None and self._child.poll() is None:
            return self._child
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])),
            OLLAMA_SPEC_TEMPLATE_MEMORY_MIB=str(limits.memory_mib),
        )
        self._child = subprocess.Popen(
            [sys.executable, "-m", "ollama_spec.prompting.sandbox"],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=package_root,
            start_new_session=True,
        )  # Ctrl-C is ours to handle
        return self._child

    def _kill(self) -> None:
        if self._child is not None:
            self._child.kill()
            self._child.wait()
            for pipe in (self._child.stdin, self._child.stdout):
                pipe.close()
            self._child = None


_sandbox = Sandbox()
atexit.register(_sandbox.close)


def render_in_sandbox(template: str, context: dict[str, Any], limits: TemplateLimits | None = None) -> str:
    """`template` rendered in the shared child process (see Sandbox.render)."""
    return _sandbox.render(template, context, limits or TemplateLimits.from_environment())


def _send(pipe, data: bytes) -> None:
    pipe.write(_HEADER.pack(len(data)) + data)
    pipe.flush()


def _receive(pipe, seconds: float | None = None) -> dict:
    """One message from `pipe`; TimeoutError when none has begun within `seconds`, EOFError when it closed."""
    if seconds is not None and not select.select([pipe], [], [], seconds)[0]:
        raise TimeoutError()
    header = pipe.read(_HEADER.size)
    if len(header) < _HEADER.size:
        raise EOFError()
    size = _HEADER.unpack(header)[0]
    data = pipe.read(size)
    if len(data) < size:
        raise EOFError()
    return json.loads(data)


# The child's side: everything below runs in the renderer process.


class _OutOfTime(BaseException):  # BaseException: a template's own error handling cannot catch it
    pass


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(jinja2.ext.Extension):
        """`{% generation %}...{% endgeneration %}`, which transformers' renderer knows (it marks the
        assistant's part for training masks): its body renders as it is."""

        tags: ClassVar[set[str]] = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    def tojson(
        value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys: bool = False
    ) -> str:
        """transformers' `tojson`: templates pass json.dumps's arguments (GLM, MiniMax) and expect text unescaped."""
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        loader=jinja2.BaseLoader(),
        extensions=[GenerationTag, jinja2.ext.loopcontrols],
    )
    env.filters["tojson"] = tojson
    return env


class _Refusal(Exception):
    pass


def _render_one(env, compiled: dict, request: dict) -> dict:
    import signal

    def raise_exception(message: str) -> None:
        raise _Refusal(message)

    def out_of_time(signum, frame) -> None:
        raise _OutOfTime()

    seconds = request["seconds"]
    signal.signal(signal.SIGALRM, out_of_time)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        source = request["template"]
        if source not in compiled:
            if len(compiled) >= 8:
                compiled.clear()
            compiled[source] = env.from_string(source)
        text = compiled[source].render(
            **request["context"], raise_exception=raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt)
        )
    except _OutOfTime:
        return {"kind": "costly", "text": f"took longer than {seconds:g} s to render"}
    except MemoryError:
        return {"kind": "costly", "text": "used more memory than a template may"}
    except _Refusal as exc:
        return {"kind": "refused", "text": str(exc)}
    except Exception as exc:  # noqa: BLE001 - the template is code from the model file: any failure is its own
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        return {"kind": "error", "text": detail}
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    if len(text) > request["max_chars"]:
        return {"kind": "costly", "text": f"wrote {len(text):,} characters, more than {request['max_chars']:,}"}
    return {"kind": "ok", "text": text}


def _limit_memory() -> None:
    try:
        import resource

        with open("/proc/self/statm") as statm:  # the address space the child already has
            now = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = now + int(os.environ.get("OLLAMA_SPEC_TEMPLATE_MEMORY_MIB", DEFAULT_MEMORY_MIB)) * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    except (ImportError, OSError, ValueError):  # not Linux: the time limit still holds
        pass


def main() -> None:
    env, compiled = _environment(), {}
    _limit_memory()
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while True:
        try:
            request = _receive(stdin)
        except EOFError:  # the parent is gone
            return
        try:
            answer = _render_one(env, compiled, request)
            data = json.dumps(answer).encode()
        except MemoryError:
            data = json.dumps({"kind": "costly", "text": "used more memory than a template may"}).encode()
        _send(stdout, data)


if __name__ == "__main__":
    main()
