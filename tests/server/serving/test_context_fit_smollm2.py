"""Open WebUI's default chat on a real model's template (SmolLM2-135M-Instruct, ChatML, no place for
tools: they go into its system message) and a context too small for it: the model reads its system
prompt and the latest turns, whole, and the answer says the tools were left out."""

import logging
import shutil

import httpx
import ollama
import pytest

from ollama_spec import Engine, EngineSettings, resolve_model
from ollama_spec.prompting.messages import ChatMessage
from ollama_spec.server.serving.request import Asked, build_request
from ollama_spec.server.serving.settings import ServerSettings
from ollama_spec.synthetic.layout import write_model
from tests import openwebui
from tests.conftest import engine_settings
from tests.serving import running_server, running_store
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


def test_open_webui_tools_on_a_model_loaded_below_its_trained_context_stay_after_one_reload(tmp_path, caplog):
    """SmolLM2 (trained 8192) loaded at Ollama's 4096, Open WebUI's 36 tools and no num_predict: the model
    loads again once, with a context in which the fitter keeps the whole prompt, tools and all; the log
    says the prompt chose that context, and nothing warns."""
    shutil.copyfile(smollm2_gguf(), tmp_path / "smollm2.gguf")
    write_model(tmp_path / "store", "smollm2", tmp_path / "smollm2.gguf", params={}, template=None)
    messages, tools = openwebui.chat(1), openwebui.builtin_tools()
    # two threads: the ~7,000-token prompt is read in full batches, work that two cores share
    settings = engine_settings(parallel=1, n_threads=2)
    with (
        running_store(tmp_path / "store", engine=settings) as (url, _),
        caplog.at_level(logging.INFO, logger="ollama_spec.server"),
    ):
        client = ollama.Client(host=url)
        client.generate("smollm2", "Hi", options={"num_predict": 1})
        assert [m.context_length for m in client.ps().models] == [4096]
        options = {"temperature": 0, "stop": [" ", "\n"]}  # a word; the room it is given is the default
        answer = client.chat(model="smollm2", messages=messages, tools=tools, options=options)
        assert [m.context_length for m in client.ps().models] == [8192]
    assert 4096 < answer.prompt_eval_count < 8192 - 512  # tools and all
    reloads = [r.getMessage() for r in caplog.records if r.getMessage().startswith("unloading smollm2")]
    assert len(reloads) == 1 and "context 8192 for a prompt that needs " in reloads[0], reloads
    assert not [r for r in caplog.records if "asked for" in r.getMessage() or r.levelno >= logging.WARNING]
