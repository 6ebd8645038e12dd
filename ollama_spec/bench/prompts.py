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
