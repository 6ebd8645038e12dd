"""Presets: Ollama Modelfiles (FROM, DRAFT, PARAMETER, SYSTEM, ...) read with Ollama's own rules.

The syntax follows Ollama's parser/parser.go: a directive is letters at the start of a line
(any case), then spaces, then a value that runs to the end of the line, or a `"..."` /
`\"\"\"...\"\"\"` string that may span lines; `#` starts a comment line; blank lines are skipped.
Ollama's `DRAFT` takes a file path; ours takes a model name or a path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ollama_spec.errors import InvalidSetting
from ollama_spec.prompting.messages import ChatMessage

# Shipped presets live inside the package (installed as package data); `modelfiles/` at the top of
# the checkout links here.
PRESETS_DIR = Path(__file__).parent.parent / "modelfiles"
SUFFIX = ".Modelfile"
MAX_MODELFILE_BYTES = 1 << 20

DIRECTIVES = ("from", "draft", "adapter", "parameter", "system", "template", "license", "message", "requires")
# Ollama's other directives name things llama.cpp loads differently or not at all here.
UNSUPPORTED = {
    "renderer": "Ollama's built-in renderers are not used (the GGUF's chat template is)",
    "parser": "Ollama's built-in output parsers are not used",
}
MESSAGE_ROLES = ("system", "user", "assistant")


def _boolean(value: str) -> bool:
    """As Go's strconv.ParseBool, which Ollama's FormatParams uses."""
    lowered = value.strip().lower()
    if lowered in ("1", "t", "true"):
        return True
    if lowered in ("0", "f", "false"):
        return False
    raise ValueError


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError
    return value


def _speculative_tokens(text: str) -> int | str:
    return "auto" if text.strip().lower() == "auto" else _positive(text)


# PARAMETER name -> (converter, what the error says it expects). The first group is used, and so are
# the penalties (repeat_penalty, repeat_last_n, presence/frequency_penalty); the rest are Ollama's own
# parameters, type-checked as Ollama does and otherwise ignored.
PARAMETERS: dict[str, tuple[Any, str]] = {
    "num_ctx": (_positive, "a positive integer"),
    "temperature": (float, "a number"),
    "top_k": (int, "an integer"),
    "top_p": (float, "a number"),
    "min_p": (float, "a number"),
    "num_predict": (int, "an integer"),
    "stop": (str, "a string"),
    "seed": (int, "an integer"),
    "num_speculative_tokens": (_speculative_tokens, "a positive integer or 'auto'"),
    "draft_p_min": (float, "a number"),
    "ngram_size": (_positive, "a positive integer"),
    **{name: (float, "a number") for name in ("typical_p", "repeat_penalty", "presence_penalty", "frequency_penalty")},
    **{
        name: (int, "an integer")
        for name in ("num_keep", "repeat_last_n", "num_batch", "num_gpu", "main_gpu", "num_thread", "draft_num_predict")
    },
    "use_mmap": (_boolean, "true or false"),
}
# A used PARAMETER's range is the rule of the settings it becomes (decoding/parameters.refusal), which a
# Modelfile is read before: the caller passes it in. (name, typed value) -> what it must be, or None.
Refusal = Callable[[str, Any], str | None]
# Parameters Ollama has dropped: `ollama create` warns and skips them (its parser/parser.go), so
# Modelfiles written for older Ollamas still load; here too, with a note.
DEPRECATED_PARAMETERS = (
    "penalize_newline",
    "low_vram",
    "f16_kv",
    "logits_all",
    "vocab_only",
    "use_mlock",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
)


@dataclass(frozen=True)
class Modelfile:
    """One parsed Modelfile. `parameters` holds typed values; `stop` collects every stop line."""

    path: Path
    model: str
    draft: str | None = None
    parameters: dict[str, Any] = field(default_factory=dict)
    system: str | None = None
    template: str | None = None
    license: tuple[str, ...] = ()
    messages: tuple[ChatMessage, ...] = ()
    deprecated: tuple[str, ...] = ()  # PARAMETERs Ollama no longer takes, skipped (say so)
    adapters: tuple[Path, ...] = ()  # ADAPTER lines: GGUF LoRA files, relative to the Modelfile's folder


_DEPRECATED = "\0deprecated"  # where _parameter collects them while parsing (no PARAMETER has this name)


class _Error(Exception):
    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


def shipped_presets() -> list[str]:
    """The names of the presets that ship with ollama-spec, sorted."""
    return sorted(p.name[: -len(SUFFIX)] for p in PRESETS_DIR.glob(f"*{SUFFIX}"))


def find_modelfile(name: str) -> Path:
    """A Modelfile path as given, else a shipped preset by name (`llama3.1-70b`)."""
    path = Path(name).expanduser()
    if path.is_file():
        return path
    if "/" not in name and "\\" not in name:
        for candidate in (PRESETS_DIR / f"{name}{SUFFIX}", PRESETS_DIR / name):
            if candidate.is_file():
                return candidate
    raise InvalidSetting(
        f"no Modelfile '{name}': give a path, or one of the shipped presets: {', '.join(shipped_presets())}"
    )


def load_modelfile(name: str, refusal: Refusal | None = None) -> Modelfile:
    """Find (see find_modelfile) and parse a Modelfile; errors name the file and the line."""
    path = find_modelfile(name)
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_MODELFILE_BYTES + 1)
    except OSError as exc:
        raise InvalidSetting(f"cannot read Modelfile {path}: {exc.strerror or exc}") from None
    if len(data) > MAX_MODELFILE_BYTES:
        raise InvalidSetting(f"{path}: larger than {MAX_MODELFILE_BYTES >> 20} MiB; is it a Modelfile?")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise InvalidSetting(f"{path}, line {line}: not UTF-8 text") from None
    return parse_modelfile(text, path, refusal)


def parse_modelfile(text: str, path: Path, refusal: Refusal | None = None) -> Modelfile:
    """Parse Modelfile `text` (read from `path`, which relative model paths are taken from); a PARAMETER
    that `refusal` refuses is an error at its line."""
    try:
        commands = _commands(text)
        return _build(commands, path, refusal)
    except _Error as exc:
        raise InvalidSetting(f"{path}, line {exc.line}: {exc}") from None


def _commands(text: str) -> list[tuple[int, str, str, str]]:
    """(line, directive, parameter name or message role, value) for each directive, in order."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    commands, i, n = [], 0, len(text)

    def line_at(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    def word(pos: int, allowed) -> tuple[str, int]:
        end = pos
        while end < n and allowed(text[end]):
            end += 1
        return text[pos:end], end

    def spaces(pos: int) -> int:
        while pos < n and text[pos] in " \t":
            pos += 1
        return pos

    while i < n:
        if text[i] in " \t\n":
            i += 1
            continue
        if text[i] == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        start = i
        name, i = word(i, lambda c: c.isascii() and c.isalpha())
        if not name or i >= n or text[i] not in " \t":
            bad = text[start : text.find("\n", start) if "\n" in text[start:] else n].strip()
            raise _Error(line_at(start), f"expected a directive and its value, got {bad!r}")
        directive = name.lower()
        if directive in UNSUPPORTED:
            raise _Error(line_at(start), f"{name.upper()} is not supported by ollama-spec: {UNSUPPORTED[directive]}")
        if directive not in DIRECTIVES:
            raise _Error(
                line_at(start), f"unknown directive {name!r}; use one of {', '.join(d.upper() for d in DIRECTIVES)}"
            )
        key = ""
        if directive in ("parameter", "message"):
            i = spaces(i)
            allowed = (
                (lambda c: c.isascii() and (c.isalnum() or c == "_"))
                if directive == "parameter"
                else (lambda c: c.isascii() and c.isalpha())
            )
            key, i = word(i, allowed)
            if not key or i >= n or text[i] not in " \t":
                raise _Error(
                    line_at(start),
                    f"{name.upper()} needs a {'name' if directive == 'parameter' else 'role'} and a value",
                )
        i = spaces(i)
        value, i = _value(text, i, line_at(start))
        commands.append((line_at(start), directive, key, value))
    return commands


def _value(text: str, i: int, line: int) -> tuple[str, int]:
    """The value starting at text[i]: a quoted string (which may span lines) or the rest of the line."""
    for quote in ('"""', '"'):
        if text.startswith(quote, i):
            end = text.find(quote, i + len(quote))
            if end < 0:
                raise _Error(line, f"unterminated {quote} string")
            after = end + len(quote)
            rest_end = text.find("\n", after)
            rest_end = len(text) if rest_end < 0 else rest_end
            if text[after:rest_end].strip():
                raise _Error(
                    text.count("\n", 0, after) + 1,
                    f"unexpected text after the closing {quote}: {text[after:rest_end].strip()!r}",
                )
            return text[i + len(quote) : end], rest_end
    end = text.find("\n", i)
    end = len(text) if end < 0 else end
    return text[i:end].strip(), end


def _build(commands: list[tuple[int, str, str, str]], path: Path, refusal: Refusal | None) -> Modelfile:
    fields: dict[str, Any] = {"parameters": {}, "license": [], "messages": [], "adapters": []}
    for line, directive, key, value in commands:
        if directive in ("from", "draft"):
            if not value:
                raise _Error(line, f"{directive.upper()} needs a model name or a .gguf path")
            fields["model" if directive == "from" else "draft"] = _model_reference(value, path)
        elif directive == "adapter":
            if not value.lower().endswith(".gguf"):
                raise _Error(
                    line,
                    f"ADAPTER needs a GGUF LoRA file (llama.cpp's convert_lora_to_gguf.py writes one), got {value!r}",
                )
            fields["adapters"].append(Path(_model_reference(value, path)))
        elif directive == "parameter":
            _parameter(fields["parameters"], key, value, line, refusal)
        elif directive == "message":
            if key not in MESSAGE_ROLES:
                raise _Error(line, f"MESSAGE role must be one of {', '.join(MESSAGE_ROLES)}, got {key!r}")
            fields["messages"].append(ChatMessage(key, value))
        elif directive == "license":
            fields["license"].append(value)
        elif directive in ("system", "template"):
            fields[directive] = value
    if "model" not in fields:
        raise InvalidSetting(f"{path}: no FROM line (the target model)")
    fields["license"], fields["messages"] = tuple(fields["license"]), tuple(fields["messages"])
    fields["adapters"] = tuple(fields["adapters"])
    fields["deprecated"] = tuple(fields["parameters"].pop(_DEPRECATED, ()))
    return Modelfile(path=path, **fields)


def _parameter(parameters: dict[str, Any], key: str, value: str, line: int, refusal: Refusal | None) -> None:
    if key in DEPRECATED_PARAMETERS:
        parameters.setdefault(_DEPRECATED, []).append(key)
        return
    if key not in PARAMETERS:
        raise _Error(line, f"unknown PARAMETER {key!r}")
    convert, expected = PARAMETERS[key]
    try:
        typed = convert(value)
    except ValueError:
        raise _Error(line, f"PARAMETER {key} must be {expected}, got {value!r}") from None
    within = refusal(key, typed) if refusal is not None else None
    if within is not None:
        raise _Error(line, f"PARAMETER {key} must be {within}, got {value!r}")
    if key == "stop":
        parameters.setdefault("stop", []).append(typed)
    else:
        parameters[key] = typed


def _model_reference(value: str, path: Path) -> str:
    """A .gguf path relative to the Modelfile's folder (as Ollama reads FROM ./file.gguf), or the name."""
    if value.lower().endswith(".gguf"):
        candidate = Path(value).expanduser()
        return str(candidate if candidate.is_absolute() else path.parent / candidate)
    return value
