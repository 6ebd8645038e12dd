"""OpenAI's Responses API: POST /v1/responses (and its event stream), the call OpenAI's own docs now
lead with (`client.responses.create(model=..., input=...)`, then `response.output_text`), with
function tools (calls come back as `function_call` items; their outputs go back in as input items).

Stateless, as a local server is: `input` carries the conversation; `previous_response_id` and
stored responses are not kept.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Literal

from fastapi import APIRouter
from fastapi import Request as HTTPRequest
from pydantic import BaseModel, ConfigDict, Field

from ollama_spec.engine.engine import Result
from ollama_spec.prompting.messages import ChatMessage, ToolCall
from ollama_spec.server.http.parsed import ParsedRoute
from ollama_spec.server.protocol.answer import AnswerParts, answer_parts
from ollama_spec.server.protocol.errors import ApiError
from ollama_spec.server.protocol.framing import Last, sse_events
from ollama_spec.server.protocol.shared import NullsAsDefaults, chat_role, tool_arguments
from ollama_spec.server.protocol.stream import answer_stream, run_to_end
from ollama_spec.server.serving.loaded import Served
from ollama_spec.server.serving.request import Asked, json_grammar, offer_tools
from ollama_spec.server.serving.state import ServerState
from ollama_spec.server.serving.worker import Job

router = APIRouter(prefix="/v1", route_class=ParsedRoute)


class InputPart(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str
    text: str | None = None


class InputItem(BaseModel):
    model_config = ConfigDict(extra="ignore")

    type: str = "message"
    role: Literal["system", "developer", "user", "assistant"] | None = None
    content: str | list[InputPart] | None = None
    # a function_call (an earlier answer) or its function_call_output
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    output: str | list[InputPart] | None = None  # a function's output: text, or text parts

    def to_chat(self) -> ChatMessage:
        if self.type != "message" or self.role is None:
            raise ApiError(400, f"input items of type '{self.type}' are not supported: send messages", "input")
        return ChatMessage(chat_role(self.role), _text_of(self.content, "content"))


TEXT_PARTS = ("input_text", "output_text", "text")


def _text_of(value: str | list[InputPart] | None, field: str) -> str:
    """A message's content or a function's output: text, or text parts joined; other parts refused."""
    parts = value if isinstance(value, list) else []
    if any(p.type not in TEXT_PARTS for p in parts):
        kinds = sorted({p.type for p in parts} - set(TEXT_PARTS))
        raise ApiError(
            400, f"{field} of type {', '.join(kinds)} is not supported: the loaded models read text only", "input"
        )
    return value if isinstance(value, str) else "".join(p.text or "" for p in parts)


class TextFormat(BaseModel):
    model_config = ConfigDict(extra="ignore")  # name, strict, description

    type: Literal["text", "json_object", "json_schema"] = "text"
    schema_: dict | None = Field(None, alias="schema")


class TextConfig(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: TextFormat | None = None


class ResponsesRequest(NullsAsDefaults):
    model_config = ConfigDict(extra="ignore")  # store, metadata, reasoning, user, ...

    model: str
    input: str | list[InputItem]
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = Field(None, ge=0, le=2)
    top_p: float | None = Field(None, gt=0, le=1)
    seed: int | None = None  # an extension, as on the completion routes
    stream: bool = False
    text: TextConfig | None = None
    previous_response_id: str | None = None
    tools: list[dict] | None = None  # {"type": "function", "name", "description", "parameters"}
    tool_choice: Literal["none", "auto", "required"] | dict | None = None

    def messages(self) -> list[ChatMessage]:
        if self.previous_response_id:
            raise ApiError(
                400,
                "previous_response_id is not supported: this server keeps no responses; send the conversation in input",
                "previous_response_id",
            )
        if isinstance(self.input, str):
            items = [ChatMessage("user", self.input)]
        else:
            items = []
            for item in self.input:
                if item.type == "function_call":  # calls of one answer share its assistant message
                    call = ToolCall(item.name or "", tool_arguments(item.arguments or "{}"), item.call_id)
                    if items and items[-1].role == "assistant" and items[-1].tool_calls:
                        items[-1] = replace(items[-1], tool_calls=(*items[-1].tool_calls, call))
                    else:
                        items.append(ChatMessage("assistant", "", (call,)))
                elif item.type == "function_call_output":
                    items.append(ChatMessage("tool", _text_of(item.output, "output"), tool_call_id=item.call_id))
                elif item.type == "reasoning":
                    continue  # a thinking model's earlier thinking, which its template leaves out of the history
                else:
                    items.append(item.to_chat())
        if not items:
            raise ApiError(400, "input is empty", "input")
        return ([ChatMessage("system", self.instructions)] if self.instructions else []) + items

    def offered_tools(self, constrained: bool) -> tuple[list[dict], str | None]:
        """The function tools in the chat completions shape the template reads, and the grammar that
        forces a call (tool_choice required, or a named function); `constrained`: text.format is set."""
        tools = self.tools or []
        if any(tool.get("type") != "function" for tool in tools):
            raise ApiError(400, "only function tools are supported (no built-in tools such as web search)", "tools")
        shaped = [
            {"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters") if k in tool}}
            for tool in tools
        ]
        choice = self.tool_choice
        only = choice.get("name") if isinstance(choice, dict) else None
        return offer_tools(shaped, choice, only, constrained)

    def grammar(self) -> str | None:
        form = self.text.format if self.text else None
        if form is None or form.type == "text":
            return None
        return json_grammar(form.schema_ if form.type == "json_schema" else None, "text.format")


@router.post("/responses")
async def responses(body: ResponsesRequest, http_request: HTTPRequest):
    state: ServerState = http_request.app.state.server
    own = body.grammar()
    tools, forced = body.offered_tools(own is not None)
    asked = Asked(
        messages=body.messages(),
        max_tokens=body.max_output_tokens,
        max_tokens_name="max_output_tokens",
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        grammar=forced or own,
        tools=tools,
    )
    # a prompt longer than the loaded context may reload the model
    served, request = await state.prepare(body.model, None, None, asked)
    job = served.submit(request, "/v1/responses")
    ids = {"response": f"resp_{uuid.uuid4().hex}", "message": f"msg_{uuid.uuid4().hex}"}
    opening = _response(served, body, ids, "in_progress")
    if body.stream:
        parts = answer_parts(served.engine, request, forced=bool(forced))
        return sse_events(_events(served, body, ids, job, opening, parts))
    result = await run_to_end(job, http_request)
    thought, text, calls = answer_parts(served.engine, request).whole(result.text, cut=result.finish_reason == "length")
    return _response(
        served,
        body,
        ids,
        _status(result, calls),
        result,
        text,
        thought,
        _function_calls(calls),
        with_message=bool(text or not calls),
    )


def _status(result: Result, calls: list[ToolCall]) -> str:
    whole = calls and all(call.cut_arguments is None for call in calls)
    return "completed" if whole or result.finish_reason == "stop" else "incomplete"


def _function_calls(calls: list[ToolCall]) -> list[dict]:
    """Each call as a function_call item; one cut short by max_output_tokens is "incomplete", its
    arguments as far as they were written (as the chat route gives them)."""
    return [
        {
            "id": f"fc_{uuid.uuid4().hex}",
            "type": "function_call",
            "call_id": f"call_{uuid.uuid4().hex[:24]}",
            "name": call.name,
            "arguments": json.dumps(call.arguments) if call.cut_arguments is None else call.cut_arguments,
            "status": "completed" if call.cut_arguments is None else "incomplete",
        }
        for call in calls
    ]


def _message(ids: dict, text: str, status: str) -> dict:
    content = (
        [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}] if status != "in_progress" else []
    )
    return {"id": ids["message"], "type": "message", "role": "assistant", "status": status, "content": content}


def _response(
    state: Served,
    body: ResponsesRequest,
    ids: dict,
    status: str,
    result: Result | None = None,
    text: str = "",
    thought: str = "",
    calls: list[dict] = (),
    *,
    with_message: bool = True,
) -> dict:
    """The response object; with a result: its message (`text`, unless the answer was only calls), its
    function_call items, and a thinking model's `thought`."""
    response = {
        "id": ids["response"],
        "object": "response",
        "created_at": int(time.time()),
        "status": status,
        "model": state.model_name,
        "output": [],
        "parallel_tool_calls": False,
        "tool_choice": body.tool_choice or ("auto" if body.tools else "none"),
        "tools": body.tools or [],
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "temperature": body.temperature,
        "top_p": body.top_p,
        "previous_response_id": None,
        "text": {"format": {"type": body.text.format.type if body.text and body.text.format else "text"}},
        "error": None,
        "incomplete_details": None,
        "usage": None,
        "metadata": {},
    }
    if result is not None:
        message = [_message(ids, text, "completed" if status == "completed" else "incomplete")] if with_message else []
        response["output"] = message + list(calls)
        if thought:  # after the message, whose place the stream fixed first
            response["output"].append(
                {
                    "id": f"rs_{ids['message'][4:]}",
                    "type": "reasoning",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": thought}],
                }
            )
        if status == "incomplete":
            response["incomplete_details"] = {"reason": "max_output_tokens"}
        response["usage"] = {
            "input_tokens": result.prompt_tokens,
            "output_tokens": len(result.tokens),
            "total_tokens": result.prompt_tokens + len(result.tokens),
            "input_tokens_details": {"cached_tokens": result.speculation.prompt_cached},
            "output_tokens_details": {"reasoning_tokens": 0},
        }
        response["speculation"] = state.summary(result)
    return response


async def _events(
    state: Served, body: ResponsesRequest, ids: dict, job: Job, opening: dict, parts: AnswerParts
) -> AsyncIterator[dict | Last]:
    """The Responses event sequence, as OpenAI streams it: a text message opened with its first text,
    then each function call, then the final response (a thinking model's thinking comes whole, as a
    reasoning item of the final response). A forced call is streamed as it is written: its item
    added with its name, then its arguments in deltas."""
    sent, thought, opened = "", "", False
    streamed: dict | None = None  # the forced call's item, while its arguments come
    where = {"item_id": ids["message"], "output_index": 0, "content_index": 0}
    yield {"type": "response.created", "response": opening}
    yield {"type": "response.in_progress", "response": opening}
    async for part in answer_stream(job, parts):
        thought += part.thought
        out = []  # this part's events: one by one, the last part's as one write (Last)
        if not opened and (part.text or (part.result is not None and not part.calls)):
            opened = True
            out.append(
                {"type": "response.output_item.added", "output_index": 0, "item": _message(ids, "", "in_progress")}
            )
            out.append(
                {
                    "type": "response.content_part.added",
                    **where,
                    "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                }
            )
        if part.text:
            sent += part.text
            out.append({"type": "response.output_text.delta", **where, "delta": part.text, "logprobs": []})
        for piece in part.call_pieces:
            if piece.name is not None:
                streamed = _function_calls([ToolCall(piece.name, {}, cut_arguments="")])[0] | {"status": "in_progress"}
                out.append({"type": "response.output_item.added", "output_index": int(opened), "item": dict(streamed)})
            if piece.arguments:
                streamed["arguments"] += piece.arguments
                at = {"item_id": streamed["id"], "output_index": int(opened)}
                out.append({"type": "response.function_call_arguments.delta", **at, "delta": piece.arguments})
        if part.result is None:
            for event in out:
                yield event
            continue
        items = _function_calls(part.calls)
        if streamed is not None:  # the item already announced, with the arguments as they were sent
            done = items[0]["status"] if items else "incomplete"
            items = [streamed | {"status": done}, *items[1:]]
        final = _response(
            state, body, ids, _status(part.result, part.calls), part.result, sent, thought, items, with_message=opened
        )
        yield Last(out + _ending(final, items, where, sent, opened, streamed is not None))


def _ending(final: dict, items: list[dict], where: dict, sent: str, opened: bool, streamed: bool) -> list[dict]:
    """The stream's last events: the message done, each call whole (a streamed call's arguments done),
    then the final response."""
    events = []
    if opened:
        message = final["output"][0]
        events.append({"type": "response.output_text.done", **where, "text": sent, "logprobs": []})
        events.append({"type": "response.content_part.done", **where, "part": message["content"][0]})
        events.append({"type": "response.output_item.done", "output_index": 0, "item": message})
    for index, item in enumerate(items, start=int(opened)):
        at = {"item_id": item["id"], "output_index": index}
        if not streamed or index > int(opened):
            added = item | {"arguments": "", "status": "in_progress"}
            events.append({"type": "response.output_item.added", "output_index": index, "item": added})
            events.append({"type": "response.function_call_arguments.delta", **at, "delta": item["arguments"]})
        events.append({"type": "response.function_call_arguments.done", **at, "arguments": item["arguments"]})
        events.append({"type": "response.output_item.done", "output_index": index, "item": item})
    return events + [{"type": f"response.{final['status']}", "response": final}]
