"""The small part of Go's text/template that Ollama's /api/generate `template` overrides use:
`{{ .System }}`, `{{ .Prompt }}`, `{{ .Response }}`, and `{{ if .X }}…{{ else }}…{{ end }}` on them,
with `{{-`/`-}}` trimming the whitespace beside an action.

Anything else (`range .Messages`, functions, pipelines) is refused by name rather than rendered
wrongly. No code is evaluated: the three fields are the only values a template can reach.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ollama_spec.errors import InvalidSetting

FIELDS = ("System", "Prompt", "Response")
SUPPORTED = "{{ .System }}, {{ .Prompt }}, {{ .Response }} and {{ if .X }}…{{ else }}…{{ end }} on them"
# An action, with Go's trim markers: "{{- " drops the whitespace before it, " -}}" the whitespace after.
ACTION = re.compile(r"\{\{(-[ \t\r\n])?(.*?)([ \t\r\n]-)?\}\}", re.DOTALL)


@dataclass(frozen=True)
class _Field:
    name: str


@dataclass
class _If:
    field: str
    then: list
    otherwise: list


def render(template: str, *, prompt: str, system: str) -> str:
    """`template` with the prompt and the system message in place, up to `{{ .Response }}` (the
    answer goes there, so Ollama cuts the prompt at it); InvalidSetting for what is not supported."""
    values = {"System": system, "Prompt": prompt}
    return "".join(_render(_parse(template), values))


def _render(nodes: list, values: dict) -> list[str]:
    """The text of `nodes`, walked with a stack of its own: ifs nest as deep as a template writes them."""
    out: list[str] = []
    pending = [iter(nodes)]
    while pending:
        node = next(pending[-1], None)
        if node is None:
            pending.pop()
        elif isinstance(node, _If):
            pending.append(iter(node.then if values.get(node.field) else node.otherwise))
        elif isinstance(node, _Field):  # Response was cut away by the parser
            out.append(values[node.name])
        else:
            out.append(node)
    return out


def _parse(template: str) -> list:
    """Nodes: text, _Field or _If. Parsing stops at the first `.Response`, as Ollama drops it and
    everything after it in the template; blocks still open there end there."""
    root: list = []
    stack: list[tuple[list, _If | None]] = [(root, None)]  # (where nodes go now, the if that holds it)
    at = 0
    for match in ACTION.finditer(template):
        text = template[at : match.start()]
        if match.group(1):
            text = text.rstrip(" \t\r\n")
        stack[-1][0].append(text)
        at = match.end()
        if match.group(3):
            rest = template[at:]
            at += len(rest) - len(rest.lstrip(" \t\r\n"))
        action = " ".join(match.group(2).split())
        words = action.split(" ")
        if action in (f".{f}" for f in FIELDS):
            if action == ".Response":
                return root
            stack[-1][0].append(_Field(action[1:]))
        elif len(words) == 2 and words[0] == "if" and words[1] in (f".{f}" for f in FIELDS):
            block = _If(words[1][1:], [], [])
            stack[-1][0].append(block)
            stack.append((block.then, block))
        elif action == "else" and stack[-1][1] is not None and stack[-1][0] is stack[-1][1].then:
            stack[-1] = (stack[-1][1].otherwise, stack[-1][1])
        elif action == "end" and len(stack) > 1:
            stack.pop()
        else:
            raise InvalidSetting(
                f"template overrides are not supported beyond {SUPPORTED}: this template has {match.group(0)}"
            )
    if len(stack) > 1:
        raise InvalidSetting("the template has an {{ if }} without its {{ end }}")
    root.append(template[at:])
    return root
