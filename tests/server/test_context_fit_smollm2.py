"""Open WebUI's default chat on a real model's template (SmolLM2-135M-Instruct, ChatML, no place for
tools: they go into its system message) and a context too small for it: the model reads its system
prompt and the latest turns, whole, and the answer says the tools were left out."""

import httpx
import ollama
import pytest

from ollama_spec import Engine, EngineSettings, resolve_model
from ollama_spec.prompting.messages import ChatMessage
from ollama_spec.server.core.request import Asked, build_request
from ollama_spec.server.core.settings import ServerSettings
from tests import openwebui
from tests.serving import running_server
from tests.smollm2 import smollm2_gguf

CONTEXT = 1024


@pytest.fixture(scope="module")
def engine():
    model = resolve_model(str(smollm2_gguf()))
    with Engine(model, None, EngineSettings(n_ctx=CONTEXT, n_threads=2, memory_check=False)) as engine:
        yield engine


def test_the_prompt_is_the_system_prompt_and_the_latest_turns(engine):
    messages, tools = openwebui.chat(12), openwebui.builtin_tools()
    asked = Asked(messages=[ChatMessage(m["role"], m["content"]) for m in messages], tools=tools, truncate=True)
    request = build_request(engine, ServerSettings(), asked)
    text = engine.target.detokenize(list(request.tokens), special=True)
    assert len(request.tokens) < CONTEXT and request.tools == ()
    assert text.startswith(f"<|im_start|>system\n{openwebui.SYSTEM}<|im_end|>\n<|im_start|>user\nQuestion ")
    assert text.endswith(f"<|im_start|>user\n{messages[-1]['content']}<|im_end|>\n<|im_start|>assistant\n")
    assert "You can call these tools" not in text and "search_web" not in text
    assert "Question 0:" not in text and "Question 11:" in text and "Answer 11:" in text


def test_open_webui_through_the_ollama_client_on_a_real_model(engine):
    messages, tools = openwebui.chat(12), openwebui.builtin_tools()
    options = {"num_predict": 24, "temperature": 0}
    with running_server(engine) as (url, _):
        answer = ollama.Client(host=url).chat(model="smollm2", messages=messages, tools=tools, options=options)
        body = {"model": "smollm2", "messages": messages, "tools": tools, "options": options, "stream": False}
        raw = httpx.post(url + "/api/chat", json=body, timeout=120).json()
    assert answer.message.content.strip() and answer.message.content == raw["message"]["content"]
    (warning,) = raw["speculation"]["warnings"]
    assert "left out the 36 tools offered" in warning and f"the context ({CONTEXT} tokens)" in warning
