"""A prompt longer than the context: Open WebUI's default chat (36 tools, a system prompt, a long
history) keeps its system prompt and latest turn, whole, the tools when they fit and then the latest
turns; what was left out is said in the response's `speculation.warnings` and the log."""

import json
import logging

import httpx
import ollama
import openai
import pytest

from ollama_spec.engine.engine import Engine, Request
from ollama_spec.prompting.messages import ChatMessage
from ollama_spec.server.serving.fitting import context_for, needs_fitting, reload_size
from ollama_spec.server.serving.request import Asked, build_request
from ollama_spec.server.serving.settings import ServerSettings
from tests import openwebui
from tests.conftest import engine_settings
from tests.serving import running_server

CONTEXT = 1024  # the request's num_ctx, below the 2048 the model is loaded with: quick to evaluate
OPTIONS = {"num_ctx": CONTEXT, "num_predict": 6, "temperature": 0}


@pytest.fixture(scope="module")
def engine(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        yield engine


@pytest.fixture(scope="module")
def server(engine):
    with running_server(engine) as (url, _):
        yield url


def _asked(messages: list[dict], tools: list[dict], context: int = CONTEXT) -> Asked:
    return Asked(
        messages=[ChatMessage(m["role"], m["content"]) for m in messages], tools=tools, n_ctx=context, truncate=True
    )


def _length(engine: Engine, messages: list[dict], tools: list[dict] = ()) -> int:
    conversation = tuple(ChatMessage(m["role"], m["content"]) for m in messages)
    return len(engine.prompt_tokens(Request(messages=conversation, tools=tuple(tools))))


def _post(url: str, path: str, body: dict) -> dict:
    response = httpx.post(url + path, json=body | {"stream": False}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


@pytest.mark.parametrize("max_tokens", [None, 40, 3000])
def test_the_context_a_prompt_asks_for_is_one_the_fitter_keeps_it_whole_in(max_tokens):
    """One rule: in the context context_for gives (the one a warning names, the least a reload asks for),
    and in every larger one, needs_fitting keeps the prompt; one token less and it would not."""
    for prompt in (100, 1500, 6604, 7180, 30_000):
        chat = Request(messages=(ChatMessage("user", "Hi"),), tokens=tuple(range(prompt)))
        wanted = context_for(prompt, max_tokens)
        assert needs_fitting(chat, wanted - 1, max_tokens)
        assert not any(needs_fitting(chat, c, max_tokens) for c in (wanted, wanted + 1, wanted * 2, 131_072))
    assert context_for(6604, None) <= 8192  # Open WebUI's tools on SmolLM2, as found: 8192 holds them


def test_a_reload_doubles_the_loaded_context_up_to_the_trained_length():
    assert reload_size(4096, 7628, 8192) == 8192 and reload_size(4096, 4200, 131_072) == 8192
    assert reload_size(4096, 20_000, 131_072) == 32_768 and reload_size(4096, 20_000, 8192) == 8192
    assert reload_size(4096, 20_000, 0) == 32_768  # the trained length unknown


def test_tools_that_cannot_fit_go_and_the_system_prompt_and_latest_turns_stay(engine):
    messages, tools = openwebui.chat(10), openwebui.builtin_tools()
    assert _length(engine, messages[:1] + messages[-1:], tools) > CONTEXT  # the tools alone overflow it
    request = build_request(engine, ServerSettings(), _asked(messages, tools))
    kept = [{"role": m.role, "content": m.content} for m in request.messages]
    assert request.tools == () and kept[0] == messages[0] and kept[-1] == messages[-1]
    start = messages.index(kept[1])
    assert messages[start]["role"] == "user" and kept == messages[:1] + messages[start:]  # whole turns
    assert len(request.tokens) == _length(engine, kept) < CONTEXT
    # a quarter of the context for the answer; history goes in stretches of a quarter of the context or
    # more (for the prompt cache), not much more
    assert CONTEXT // 2 - _length(engine, messages[1:3]) < len(request.tokens) <= CONTEXT * 3 // 4
    full = _length(engine, messages, tools)
    (warning,) = request.warnings
    assert f"the prompt ({full} tokens) is longer than the context ({CONTEXT} tokens)" in warning
    assert f"left out the 36 tools offered ({full - _length(engine, messages)} tokens)" in warning
    assert f"the oldest {start - 1} of {len(messages)} messages" in warning
    assert "cut" not in warning and warning.endswith(
        "; not even the model's trained context (8192 tokens) holds all of it: offer fewer tools or start a new chat"
    )


def test_tools_that_fit_stay_and_the_oldest_turns_go(engine):
    messages, tools = openwebui.chat(10), openwebui.builtin_tools()[:1]
    request = build_request(engine, ServerSettings(), _asked(messages, tools, 2048))
    assert request.tools == tuple(tools) and request.messages[0].content == openwebui.SYSTEM
    assert request.messages[-1].content == messages[-1]["content"]
    assert 1024 - _length(engine, messages[1:3]) < len(request.tokens) <= 1536
    start = len(messages) - len(request.messages) + 1
    (warning,) = request.warnings
    assert "tools" not in warning and f"left out the oldest {start - 1} of {len(messages)} messages" in warning
    wanted = context_for(_length(engine, messages, tools), None)
    assert warning.endswith(f"; a num_ctx of {wanted} or more would keep all of it")
    assert request.context_wanted == wanted


def test_a_latest_turn_too_long_is_cut_after_the_tools_and_history_go_and_keeps_the_system_prompt(engine):
    messages = openwebui.chat(3, latest="Summarise this: " + "the tide rises and falls " * 300)
    request = build_request(engine, ServerSettings(), _asked(messages, openwebui.builtin_tools()))
    assert request.tools == () and len(request.tokens) < CONTEXT
    (warning,) = request.warnings
    assert "left out the 36 tools offered" in warning and "the oldest 6 of 8 messages" in warning
    text = engine.target.detokenize(list(request.tokens), special=True)
    assert text.startswith(f"<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{openwebui.SYSTEM}")
    assert text.endswith("the tide rises and falls<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n")
    assert "Summarise this" not in text  # the start of the latest message is what goes
    kept = len(engine.target.tokenize(text.split("<|start_header_id|>user")[0], add_bos=False, special=True))
    assert f"; cut {_length(engine, messages[:1] + messages[-1:])} tokens to " in warning
    first = int(warning.split("its first ")[1].split()[0])
    assert kept < first <= kept + 8  # all up to the latest message's text: its header too


def test_open_webui_chat_through_the_ollama_client(server):
    """The answer is the one to the kept conversation without tools, and the response says what went."""
    messages, tools = openwebui.chat(10), openwebui.builtin_tools()
    client = ollama.Client(host=server)
    answer = client.chat(model="m", messages=messages, tools=tools, options=OPTIONS)
    raw = _post(server, "/api/chat", {"model": "m", "messages": messages, "tools": tools, "options": OPTIONS})
    (warning,) = raw["speculation"]["warnings"]
    dropped = int(warning.split("the oldest ")[1].split(" of")[0])
    kept = messages[:1] + messages[1 + dropped :]
    alone = client.chat(model="m", messages=kept, options=OPTIONS)
    assert answer.message.content == alone.message.content == raw["message"]["content"]
    assert "left out the 36 tools offered" in warning


def test_a_chat_that_leaves_its_answer_too_little_room_loses_old_turns(server, engine):
    """Ollama's runner shifts the context to go on writing; here the answer would end at the context's
    end, so a chat that fits but leaves num_predict no room drops old turns first."""
    messages = openwebui.chat(3)
    while _length(engine, messages) < CONTEXT - 30:
        messages[-1] = {"role": "user", "content": messages[-1]["content"] + " and then"}
    assert _length(engine, messages) < CONTEXT  # it fits, with fewer than 30 tokens left
    options = OPTIONS | {"num_predict": 40}
    answer = ollama.Client(host=server).chat(model="m", messages=messages, options=options)
    assert answer.prompt_eval_count <= CONTEXT - 40 and (answer.eval_count == 40 or answer.done_reason == "stop")
    raw = _post(server, "/api/chat", {"model": "m", "messages": messages, "options": options})
    (warning,) = raw["speculation"]["warnings"]
    assert warning.startswith(f"the prompt ({_length(engine, messages)} tokens) leaves the answer fewer than 40 of")


def test_a_long_message_that_fits_with_nothing_to_leave_out_stays_without_a_warning(server, engine, caplog):
    """One message that fits the context (2048) but leaves its answer less than the room it would get: with
    nothing it could leave out, it stays whole and the answer has what is left; no warning says nothing."""
    messages = [{"role": "user", "content": "Summarise this: " + "the tide rises and falls " * 135}]
    n = _length(engine, messages)
    assert 2048 - 512 < n < 2048
    options = {"temperature": 0, "num_predict": 600}  # more than is left: the answer ends at the context's end
    with caplog.at_level(logging.WARNING, logger="ollama_spec.server"):
        answer = ollama.Client(host=server).chat(model="m", messages=messages, options=options)
        raw = _post(server, "/api/chat", {"model": "m", "messages": messages, "options": options})
    assert answer.prompt_eval_count == raw["prompt_eval_count"] == n
    assert answer.eval_count <= 2048 - n and "warnings" not in raw["speculation"]
    assert not caplog.records


def test_a_warning_is_logged_once_for_the_request_as_it_runs(server, engine, caplog):
    messages, tools = openwebui.chat(10), openwebui.builtin_tools()
    body = {"model": "m", "messages": messages, "tools": tools, "options": OPTIONS}
    with caplog.at_level(logging.WARNING, logger="ollama_spec.server"):
        (warning,) = _post(server, "/api/chat", body)["speculation"]["warnings"]
    assert [r.getMessage() for r in caplog.records] == [f"tiny-target:latest: {warning}"]


def test_the_next_turns_find_their_prompt_in_the_cache(server):
    """Old turns dropped whole, in stretches, keep the prompt's start where it was: a turn re-reads its own
    messages, not the whole prompt (as a token cut did, or dropping just enough on every turn would)."""
    body = {"model": "m", "tools": openwebui.builtin_tools(), "options": OPTIONS}
    messages, reread = openwebui.chat(60, words=6), []  # turns as short as the next ones
    for day in range(8):
        answer = _post(server, "/api/chat", body | {"messages": messages})
        spec = answer["speculation"]
        assert spec["prompt_tokens"] < CONTEXT and "left out the 36 tools" in spec["warnings"][0]
        reread.append(spec["prompt_tokens"] - spec["prompt_cached_tokens"])
        messages = [*messages, answer["message"], {"role": "user", "content": f"And on day {day}?"}]
    assert sum(n < 40 for n in reread[1:]) >= 6, reread


def test_a_raw_prompt_too_long_is_cut_as_before_and_says_so(server):
    prompt = "Tell a story about the sea and the sky and the wind and the rain"
    body = {"model": "m", "prompt": prompt, "raw": True, "options": {"num_ctx": 16, "temperature": 0}}
    answer = _post(server, "/api/generate", body)
    assert answer["prompt_eval_count"] == 11  # Ollama's cut: the first 4 tokens and BOS, then the end
    (warning,) = answer["speculation"]["warnings"]
    assert warning.startswith("the prompt (") and "cut " in warning and "to 11, its first 5 and its last 6" in warning
    streamed = httpx.post(server + "/api/generate", json=body, timeout=120).text.splitlines()  # streams by default
    assert json.loads(streamed[-1])["speculation"]["warnings"] == [warning]  # the last chunk carries it too


def test_openai_client_is_told_what_the_tools_take_and_whether_a_num_ctx_helps(server, engine):
    """/v1/chat/completions does not cut (OpenAI refuses such a prompt): its error says why it is long, and
    advises a larger num_ctx only below the model's trained context (8192), where one can help."""
    messages, tools = openwebui.chat(10), openwebui.builtin_tools()
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused")
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="m", messages=messages, tools=tools, max_tokens=4)
    full, bare = _length(engine, messages, tools), _length(engine, messages)
    assert full > 8192 and refused.value.code == "context_length_exceeded"
    assert f"the prompt is {full} tokens ({full - bare} of them the 36 tools offered)" in refused.value.message
    assert "num_ctx" in refused.value.message and "larger num_ctx" not in refused.value.message
    assert "shorten it or offer fewer tools: it is past the model's trained context (8192 tokens)" in str(refused.value)
    longer = openwebui.chat(20)  # past the loaded 2048 tokens, within the trained 8192
    assert engine.target.n_ctx < _length(engine, longer) < 8192
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="m", messages=longer, max_tokens=4)
    assert "shorten it or load the model with a larger num_ctx" in refused.value.message
