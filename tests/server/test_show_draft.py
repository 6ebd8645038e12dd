"""`"show_draft": true` on the four completion routes: each chunk's `draft_spans` says which characters
of its content accepted draft tokens wrote; without it, the answers are what they always were."""

import dataclasses
import json

import httpx
import pytest
from openai import OpenAI

from ollama_spec.engine.engine import Engine
from tests.conftest import engine_settings
from tests.serving import running_server, running_store

USER = [{"role": "user", "content": "Explain the difference between a process and a thread."}]
PROMPT = "The quick brown fox"
# route, body, where a chunk's content is, and how the route streams
ROUTES = {
    "openai-chat": ("/v1/chat/completions", {"messages": USER, "max_tokens": 60}, "sse"),
    "openai-completions": ("/v1/completions", {"prompt": PROMPT, "max_tokens": 60}, "sse"),
    "ollama-chat": ("/api/chat", {"messages": USER, "options": {"num_predict": 60}}, "ndjson"),
    "ollama-generate": ("/api/generate", {"prompt": PROMPT, "options": {"num_predict": 60}}, "ndjson"),
}
# A thinking template (Qwen3's tags, which tell the server the model thinks) and a grammar that makes the tiny model think, say something,
# call a tool and say something after the call: every stage that holds text back or takes it out.
THINKING_TEMPLATE = (
    "{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{%- endfor %}{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n"
    "{%- if enable_thinking is false %}<think>\n\n</think>\n\n{%- endif %}{%- endif %}"
)
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
THINK_CALL_ANSWER = (
    'root ::= "<think>" "The user wants weather." "</think>" "\\n\\n" "Let me check the weather." '
    + json.dumps(CALL)
    + ' "\\n done"'
)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


@pytest.fixture(scope="module")
def drafted(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine, running_server(engine) as (url, _):
        yield url


@pytest.fixture(scope="module")
def alone(tiny_models):
    with Engine(tiny_models[0], None, engine_settings()) as engine, running_server(engine) as (url, _):
        yield url


def chunks(url: str, route: str, body: dict) -> tuple[str, list[dict]]:
    """The raw streamed answer and its chunks (the last, done or [DONE], left out)."""
    path, fields, framing = ROUTES[route]
    raw = httpx.post(url + path, json={"model": "m", "stream": True} | fields | body, timeout=60).text
    if framing == "sse":
        lines = [line.removeprefix("data: ") for line in raw.split("\n\n") if line]
        return raw, [json.loads(line) for line in lines if line != "[DONE]"]
    return raw, [json.loads(line) for line in raw.splitlines()]


def whole(url: str, route: str, body: dict) -> dict:
    path, fields, _ = ROUTES[route]
    return httpx.post(url + path, json={"model": "m", "stream": False} | fields | body, timeout=60).json()


def content(chunk: dict) -> str:
    """A chunk's (or answer's) content, whatever the route."""
    if "choices" in chunk:
        choice = chunk["choices"][0] if chunk["choices"] else {}
        return choice.get("text") or (choice.get("delta") or choice.get("message") or {}).get("content") or ""
    return chunk.get("response") or chunk.get("message", {}).get("content") or ""


def spans(chunk: dict):
    return chunk["choices"][0]["draft_spans"] if "choices" in chunk else chunk["draft_spans"]


def marks(text: str, given: list) -> list[bool]:
    """The spans, checked (in bounds, ordered, apart, none empty), as one mark per character."""
    assert isinstance(given, list)
    flags, end = [False] * len(text), -1
    for start, stop in given:
        assert end < start < stop <= len(text), given  # apart: touching spans would be one
        flags[start:stop] = [True] * (stop - start)
        end = stop
    return flags


def streamed_marks(url: str, route: str, body: dict | None = None) -> tuple[str, list[bool]]:
    """The streamed content with show_draft, and its marks stitched from every chunk's spans."""
    _, parts = chunks(url, route, {"show_draft": True} | (body or {}))
    text, flags = "", []
    for chunk in parts:
        if piece := content(chunk):
            text, flags = text + piece, flags + marks(piece, spans(chunk))
        else:  # only a chunk with content says which of it was drafted
            assert "draft_spans" not in json.dumps(chunk)
    return text, flags


@pytest.mark.parametrize("route", ROUTES)
def test_each_chunk_marks_the_characters_the_draft_wrote(drafted, route):
    raw, plain = chunks(drafted, route, {})
    assert '"draft_spans"' not in raw
    text, flags = streamed_marks(drafted, route)
    assert text == "".join(content(c) for c in plain) and len(text) > 20  # greedy: the same answer
    assert any(flags) and not all(flags)  # the draft wrote some of it, the target the rest


@pytest.mark.parametrize("route", ROUTES)
def test_a_whole_answer_marks_its_whole_content_as_its_stream_did(drafted, route):
    plain = whole(drafted, route, {})
    assert "draft_spans" not in json.dumps(plain)
    answer = whole(drafted, route, {"show_draft": True})
    assert content(answer) == content(plain)
    assert marks(content(answer), spans(answer)) == streamed_marks(drafted, route)[1]


@pytest.mark.parametrize("route", ROUTES)
def test_show_draft_false_changes_no_chunk(drafted, route):
    def comparable(chunk):  # what differs between any two requests: ids, clocks, speeds, the cache
        fields = ("id", "created", "created_at", "speculation", "usage", "timings", "prompt_eval_cached_count")
        return {k: v for k, v in chunk.items() if k not in fields and not k.endswith("_duration")}

    def answer(chunks):  # the content, and every chunk but the content as it is (where a step's tokens
        # fall between chunks depends on when the server's loop reads them: not compared)
        text = "".join(content(c) for c in chunks)
        return text, [comparable(c) for c in chunks if not content(c)]

    raw, asked_not = chunks(drafted, route, {"show_draft": False})
    assert '"draft_spans"' not in raw
    assert answer(asked_not) == answer(chunks(drafted, route, {})[1])


@pytest.mark.parametrize("route", ROUTES)
def test_the_target_alone_drafts_nothing(alone, route):
    text, flags = streamed_marks(alone, route)
    assert text and not any(flags)
    answer = whole(alone, route, {"show_draft": True})
    assert spans(answer) == []


def test_a_store_served_with_no_draft_drafts_nothing(tiny_store):
    with running_store(tiny_store, no_draft=True) as (url, _):
        text, flags = streamed_marks(url, "ollama-generate", {"model": "tiny-target"})
        assert text and flags == [False] * len(text)


def test_echoed_prompt_is_not_drafted(drafted):
    echoed = whole(drafted, "openai-completions", {"show_draft": True, "echo": True})
    answer = whole(drafted, "openai-completions", {"show_draft": True})
    shifted = [[start + len(PROMPT), end + len(PROMPT)] for start, end in answer["choices"][0]["draft_spans"]]
    assert echoed["choices"][0]["draft_spans"] == shifted
    _, parts = chunks(drafted, "openai-completions", {"show_draft": True, "echo": True})
    assert content(parts[0]) == PROMPT and parts[0]["choices"][0]["draft_spans"] == []


def test_stop_strings_cut_the_spans_with_the_text(drafted):
    full, _ = streamed_marks(drafted, "openai-chat")
    stop = full[len(full) // 2 : len(full) // 2 + 3]
    text, _ = streamed_marks(drafted, "openai-chat", {"stop": [stop]})
    assert text == full[: full.index(stop)]


def test_the_openai_client_reads_the_spans_through_extra_body(drafted):
    client = OpenAI(base_url=drafted + "/v1", api_key="anything")
    ask = {"model": "m", "messages": USER, "max_tokens": 60, "temperature": 0}
    text, flags = "", []
    for chunk in client.chat.completions.create(**ask, stream=True, extra_body={"show_draft": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            piece = chunk.choices[0].delta.content
            text, flags = text + piece, flags + marks(piece, chunk.choices[0].model_extra["draft_spans"])
    assert text == client.chat.completions.create(**ask).choices[0].message.content
    assert any(flags)
    answer = client.chat.completions.create(**ask, extra_body={"show_draft": True}).choices[0]
    assert marks(answer.message.content, answer.model_extra["draft_spans"]) == flags
    plain = client.chat.completions.create(**ask, stream=True)
    assert all("draft_spans" not in (c.choices[0].model_extra or {}) for c in plain if c.choices)


@pytest.fixture(scope="module")
def thinking(tiny_models):
    target = tiny_models[0]
    target = dataclasses.replace(target, info=dataclasses.replace(target.info, chat_template=THINKING_TEMPLATE))
    with Engine(target, tiny_models[1], engine_settings()) as engine, running_server(engine) as (url, _):
        yield url


def test_spans_stay_on_the_content_around_thinking_and_tool_calls(thinking):
    body = {"tools": [WEATHER], "grammar": THINK_CALL_ANSWER, "max_tokens": 400}
    text, flags = streamed_marks(thinking, "openai-chat", body)
    assert text == "Let me check the weather.done"  # the thinking and the call are not content
    answer = whole(thinking, "openai-chat", body | {"show_draft": True})
    message = answer["choices"][0]["message"]
    assert message["content"] == text and message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert message["reasoning"] == "The user wants weather."
    assert marks(text, spans(answer)) == flags
