"""Tool (function) calling: the tools a client offers go into the model's chat template, and the
calls the model writes are read back out of its text.

Models write calls in the formats their templates teach: a bare JSON object (Llama 3.1-3.3 after
its hidden <|python_tag|>, Mistral after its hidden [TOOL_CALLS], as a list), or one JSON object
per <tool_call>...</tool_call> block (Hermes, Qwen 2.5 and 3). A call counts only when it names
an offered tool, as Ollama's parser does; anything else stays text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from ollama_spec.errors import InvalidSetting
from ollama_spec.prompting.messages import ChatMessage, ToolCall, name_tool_answers

BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)
OPENING = "<tool_call>"


def tool_names(tools: list[dict]) -> list[str]:
    """The function names of OpenAI-shaped tools ({"type": "function", "function": {"name": ...}})."""
    names = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
            raise InvalidSetting('each tool must be {"type": "function", "function": {"name": ..., "parameters": ...}}')
        names.append(function["name"])
    return names


def template_takes_tools(template: str | None) -> bool:
    """Does the chat template render a `tools` list? (Where it does not, tools_in_messages describes them.)"""
    return bool(template) and re.search(r"\btools\b", template) is not None


# For a template with no place for tools: the tools described in the system message, in the bare
# JSON form the parser reads back (llama.cpp's server has such a generic form too).
TOOLS_IN_SYSTEM = (
    "You can call these tools:\n{tools}\n\nTo call a tool, answer with nothing but a JSON object: "
    '{{"name": "<tool name>", "arguments": {{<its arguments>}}}}. Otherwise, answer as usual.'
)


def tools_in_messages(messages: list[ChatMessage], tools: list[dict]) -> list[ChatMessage]:
    """The conversation for a template that cannot render tools: the tools described in the system
    message, earlier calls written as the JSON the model is asked for, and each tool's answer as a
    user turn (such templates know no tool role)."""
    described = TOOLS_IN_SYSTEM.format(tools="\n".join(json.dumps(tool["function"]) for tool in tools))
    system = "\n\n".join(m.content for m in messages if m.role == "system" and m.content)
    turns = [ChatMessage("system", f"{system}\n\n{described}" if system else described)]
    for message in name_tool_answers(messages):
        if message.role == "system":
            continue
        if message.tool_calls:
            calls = "\n".join(json.dumps({"name": c.name, "arguments": c.arguments}) for c in message.tool_calls)
            message = ChatMessage("assistant", f"{message.content}\n{calls}".strip())
        elif message.role == "tool":
            name = f" {message.tool_name}" if message.tool_name else ""
            message = ChatMessage("user", f"The tool{name} answered: {message.content}")
        turns.append(message)
    return turns


def parse_tool_calls(text: str, names: list[str]) -> tuple[str, list[ToolCall]]:
    """The text's tool calls to the tools named `names`, and the text left around them.

    No calls (text unchanged) when the text is not a call, or names a tool that was not offered."""
    if OPENING in text:
        calls = [_call(_loads(body)) for body in BLOCK.findall(text)]
        rest = BLOCK.sub("", text).strip()
    else:
        values = _json_values(text.strip())
        if values is None:
            return text, []
        calls = [_call(v) for value in values for v in (value if isinstance(value, list) else [value])]
        rest = ""
    if not calls or any(call is None or call.name not in names for call in calls):
        return text, []
    return rest, calls


def _begun(word: str, then: str = "") -> str:
    """A regex for any start of `word` ("", "n", "na", ...), and for the whole word followed by `then`."""
    return "".join(f"(?:{re.escape(c)}" for c in word) + then + ")?" * len(word)


_CUT_CALL = re.compile(
    r'\s*\{\s*"name"\s*:\s*"([^"\\]*)"\s*(?:,\s*(?:"arguments"\s*(?::\s*(.*))?|"' + _begun("arguments") + ")?)?",
    re.DOTALL,
)


_CUT_NAME = re.compile(r'\s*\{\s*(?:"' + _begun('name"', r'\s*(?::\s*(?:"([^"\\]*))?)?') + ")?")


def cut_tool_call(text: str, names: list[str]) -> ToolCall | None:
    """A bare JSON call that the answer's length cut short, `{"name": "f", "arguments": {"a": 1, "b"`:
    the call with its arguments as written so far, as OpenAI returns a call cut by max_tokens (clients
    then report an invalid call instead of taking the JSON for an answer); None for anything else."""
    match = _CUT_CALL.fullmatch(text)
    if match is not None and match.group(1) in names:
        return ToolCall(match.group(1), {}, cut_arguments=(match.group(2) or "").rstrip())
    # cut inside the name (or before it): the one offered tool it can still be, if only one
    begun = _CUT_NAME.fullmatch(text)
    candidates = [name for name in names if begun is not None and name.startswith(begun.group(1) or "")]
    return ToolCall(candidates[0], {}, cut_arguments="") if len(candidates) == 1 else None


def could_be_tool_call(text: str) -> bool:
    """Might `text`, the start of an answer, still turn out to be a tool call? (Streams hold it back.)

    A call opens with `{"` or `[{"` (whitespace allowed between), or with <tool_call>: a Markdown
    link `[...](...)` or a brace of code is text from its second character on."""
    start = text.lstrip()
    if start.startswith("["):
        start = start[1:].lstrip()
        if not start:
            return True
    if start.startswith("{"):
        return start[1:].lstrip()[:1] in ("", '"')
    return OPENING.startswith(start[: len(OPENING)])


def forced_call_schema(tools: list[dict], only: str | None = None) -> dict:
    """The JSON Schema of one call, {"name": ..., "arguments": {...}}, to any offered tool or to `only`
    (OpenAI's tool_choice "required", or a named function): llama/grammar makes the grammar of it."""
    names = tool_names(tools)
    if only is not None and only not in names:
        raise InvalidSetting(f"tool_choice names '{only}', which is not among the tools offered")
    choices, defs = [], {}
    for number, (tool, name) in enumerate(zip(tools, names)):
        if only is None or name == only:
            parameters = _hoisted(tool["function"].get("parameters") or {"type": "object"}, f"tool{number}def", defs)
            choices.append(
                {
                    "type": "object",
                    "required": ["name", "arguments"],
                    "properties": {"name": {"const": name}, "arguments": parameters},
                }
            )
    schema = choices[0] if len(choices) == 1 else {"anyOf": choices}
    return {**schema, "$defs": defs} if defs else schema


# A forced call's opening as the grammar writes it: the name first (the schema's order), then the
# arguments' key; the lookahead waits for the arguments' first character.
_CALL_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"((?:[^"\\]|\\.)*)"\s*,\s*"arguments"\s*:\s*(?=\S)')


@dataclass(frozen=True)
class CallPiece:
    """A piece of a call being written: its name in the first piece only, then its arguments' JSON text."""

    name: str | None
    arguments: str


class ForcedCallText:
    """The one call a grammar forces (forced_call_schema), read as it is written: its name once whole,
    then its arguments' JSON piece by piece, up to the brace that closes them (the wrapper's own `}`
    after it is no part of them). Joined, the pieces are the arguments' text as the model wrote it."""

    def __init__(self, names: list[str]):
        self.names, self.text, self.name, self.at = names, "", None, 0
        self.depth, self.in_string, self.escaped, self.closed = 0, False, False, False

    def push(self, text: str) -> list[CallPiece]:
        self.text += text
        named = self.name is None
        if named:
            head = _CALL_HEAD.match(self.text)
            if head is None or (name := _loads(f'"{head.group(1)}"')) not in self.names:
                return []
            self.name, self.at = name, head.end()
        start = self.at
        while self.at < len(self.text) and not self.closed:
            self._scan(self.text[self.at])
            self.at += 1
        piece = self.text[start : self.at]
        return [CallPiece(self.name if named else None, piece)] if named or piece else []

    def _scan(self, c: str) -> None:
        """One character of the arguments: strings (with their escapes) hide brackets; the arguments
        close where the depth they opened comes back to 0."""
        if self.in_string:
            self.escaped, self.in_string = (False, True) if self.escaped else (c == "\\", c != '"')
        elif c == '"':
            self.in_string = True
        elif c in "{[":
            self.depth += 1
        elif c in "}]":
            self.depth -= 1
            self.closed = self.depth == 0


_DEFS = ("$defs", "definitions")


def _hoisted(parameters: dict, prefix: str, defs: dict) -> dict:
    """A tool's parameter schema, placed inside the call's wrapper: its `$defs` (pydantic writes them for
    nested models and enums) move to the wrapper's root, and its `#/$defs/...` references follow them,
    since a reference is read from the root of the whole schema. They are renamed `prefix` + a number:
    letters and digits only, which the grammar converter names its rules by alike wherever a recursive
    model refers to itself (it would write `a_b` for a rule it defined as `a-b`)."""
    local = {
        name: schema
        for key in _DEFS
        if isinstance(parameters.get(key), dict)
        for name, schema in parameters[key].items()
    }
    renamed = {name: f"{prefix}{number}" for number, name in enumerate(local)}

    def rewrite(node: Any) -> Any:
        if isinstance(node, list):
            return [rewrite(item) for item in node]
        if not isinstance(node, dict):
            return node
        out = {key: rewrite(value) for key, value in node.items() if key != "$ref"}
        ref = node.get("$ref")
        if isinstance(ref, str):
            for base in ("#/$defs/", "#/definitions/"):
                head, _, rest = ref.removeprefix(base).partition("/")
                head = head.replace("~1", "/").replace("~0", "~")  # JSON pointer escapes
                if ref.startswith(base) and head in renamed:
                    ref = f"#/$defs/{renamed[head]}" + (f"/{rest}" if rest else "")
                    break
            out["$ref"] = ref
        return out

    for name, schema in local.items():
        defs[renamed[name]] = rewrite(schema)
    return rewrite({key: value for key, value in parameters.items() if key not in _DEFS})


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def _json_values(text: str) -> list[Any] | None:
    """One or more JSON values making up the whole text (separated by ';' or whitespace), else None."""
    if not text or text[0] not in "{[":
        return None
    decoder, values, at = json.JSONDecoder(), [], 0
    while at < len(text):
        try:
            value, at = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            return None
        values.append(value)
        while at < len(text) and text[at] in " \t\r\n;":
            at += 1
    return values


def _call(value: Any) -> ToolCall | None:
    """{"name", "arguments" | "parameters"}, or OpenAI's {"function": {...}}, as a call; else None."""
    if isinstance(value, dict) and isinstance(value.get("function"), dict):
        value = value["function"]
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    arguments = value.get("arguments", value.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string, as OpenAI sends them
        arguments = _loads(arguments)
    return ToolCall(value["name"], arguments) if isinstance(arguments, dict) else None
