"""The prompts a benchmark runs: a built-in set of varied kinds, or `--prompts FILE`.

FILE holds one prompt per line. A line starting with `{` is a JSON object
`{"prompt": "...", "system": "...", "name": "..."}` (only "prompt" is required); any other
non-blank line is the prompt text itself, and lines starting with `#` are comments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ollama_spec.errors import InvalidSetting


@dataclass(frozen=True)
class Prompt:
    name: str
    prompt: str
    system: str | None = None


BUILTIN_PROMPTS = (
    Prompt(
        "code",
        "Write a Python function that checks whether a string is a palindrome, "
        "ignoring case and punctuation, with a docstring and two doctests.",
    ),
    Prompt("factual", "List the planets of the solar system in order from the Sun, with one fact about each."),
    Prompt(
        "explanation",
        "Jelaskan arsitektur microservices vs monolith dan kapan harus migrasi.",
        system="Anda pakar arsitektur perangkat lunak.",
    ),
    Prompt(
        "translation",
        'Translate into French: "The meeting has been moved to Thursday morning because '
        'the projector in the main room is broken."',
    ),
    Prompt("creative", "Write a short story about a lighthouse keeper who finds a message in a bottle."),
)


_ESSAY = (
    "Lighthouses were once kept by families who lived beside the lamp. Each evening the keeper climbed "
    "the tower, trimmed the wick, wound the clockwork that turned the lens, and wrote the weather in the "
    "log. In a storm the keeper stayed awake all night, because a lamp that failed could cost a ship. "
    "Today most lighthouses run themselves, and their logs are kept in museums."
)
_CODE = (
    "def mean(values):\n"
    "    total = 0\n"
    "    for value in values:\n"
    "        total = total + value\n"
    "    return total / len(values)\n"
    "\n\n"
    "def variance(values):\n"
    "    m = mean(values)\n"
    "    total = 0\n"
    "    for value in values:\n"
    "        total = total + (value - m) * (value - m)\n"
    "    return total / len(values)\n"
)

# Answers that copy most of their input: where prompt lookup (--ngram) proposes long runs.
REWRITE_PROMPTS = (
    Prompt("edit-text", f"Rewrite this text in the past tense, changing nothing else:\n\n{_ESSAY}"),
    Prompt("edit-code", f"Add type hints to this Python code and return the whole file:\n\n{_CODE}"),
    Prompt("quote", f"Repeat the following paragraph exactly, then give it a title:\n\n{_ESSAY}"),
)
PROMPT_SETS = {"default": BUILTIN_PROMPTS, "rewrite": REWRITE_PROMPTS}


def prompts_for(name_or_path: str | None) -> tuple[Prompt, ...]:
    """A built-in set by name ("default", "rewrite"), else a prompts file; None: the default set."""
    if name_or_path is None:
        return BUILTIN_PROMPTS
    if name_or_path in PROMPT_SETS and not Path(name_or_path).exists():
        return PROMPT_SETS[name_or_path]
    return load_prompts(name_or_path)


def load_prompts(path: str | Path) -> tuple[Prompt, ...]:
    """Read a prompts file (JSON lines or plain lines, see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise InvalidSetting(f"prompts file {path} does not exist")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InvalidSetting(f"cannot read prompts file {path}: {exc}") from None
    prompts = []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name = f"prompt {len(prompts) + 1}"
        if stripped.startswith("{"):
            prompts.append(_json_prompt(stripped, f"{path} line {number}", name))
        else:
            prompts.append(Prompt(name, stripped))
    if not prompts:
        raise InvalidSetting(f"prompts file {path} holds no prompts")
    return tuple(prompts)


def _json_prompt(text: str, where: str, default_name: str) -> Prompt:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidSetting(f"{where}: not valid JSON ({exc.msg})") from None
    prompt, system = data.get("prompt"), data.get("system")
    if not isinstance(prompt, str) or not prompt:
        raise InvalidSetting(f'{where}: needs a "prompt" string')
    if system is not None and not isinstance(system, str):
        raise InvalidSetting(f'{where}: "system" must be a string')
    return Prompt(str(data.get("name") or default_name), prompt, system)
