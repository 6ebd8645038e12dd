"""The Ollama-compatible API, driven by the official `ollama` client against the real server."""

import json
from dataclasses import replace

import httpx
import ollama
import pytest

from ollama_spec.engine.engine import Engine
from ollama_spec.server.serving.request import Asked
from tests.conftest import engine_settings
from tests.serving import running_server

MESSAGES = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Why is the sky blue?"}]
GREEDY = {"temperature": 0, "num_predict": 40}


@pytest.fixture(scope="module")
def server(tiny_models):
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        with running_server(engine) as (url, state):
            yield url, state


@pytest.fixture
def client(server):
    return ollama.Client(host=server[0])


def test_chat_as_the_docs_show(client):
    response = client.chat(model="llama3.2", messages=MESSAGES, options=GREEDY)
    assert response.message.role == "assistant" and len(response.message.content) > 10
    assert response.done and response.done_reason == "length" and response.model == "llama3.2"
    assert response.eval_count == 40 and response.prompt_eval_count > 10
    assert response.total_duration >= response.eval_duration > 0
    assert response.prompt_eval_duration > 0 and 0 <= response.load_duration < response.total_duration


def test_final_object_carries_the_speculation_extension(server):
    body = {"model": "x", "messages": MESSAGES, "options": GREEDY, "stream": False}
    answer = httpx.post(server[0] + "/api/chat", json=body, timeout=60).json()
    spec = answer["speculation"]  # the ollama client drops fields it does not know; raw JSON has it
    assert spec["drafted_tokens"] >= spec["accepted_tokens"] > 0
    assert spec["prompt_tokens"] == answer["prompt_eval_count"]


def test_streamed_chat_is_the_same_text_and_ends_with_the_counts(client):
    whole = client.chat(model="llama3.2", messages=MESSAGES, options=GREEDY)
    parts = list(client.chat(model="llama3.2", messages=MESSAGES, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].eval_count == 40 and parts[-1].done_reason == "length"


def test_generate_streamed_and_not(client):
    whole = client.generate(model="llama3.2", prompt="Once upon a time", options=GREEDY)
    parts = list(client.generate(model="llama3.2", prompt="Once upon a time", options=GREEDY, stream=True))
    assert whole.response and "".join(p.response for p in parts) == whole.response
    assert whole.done and whole.eval_count == parts[-1].eval_count == 40
    raw = client.generate(model="llama3.2", prompt="Once upon a time", raw=True, options=GREEDY)
    assert raw.response != whole.response and raw.prompt_eval_count < whole.prompt_eval_count


def test_streaming_is_the_default_and_is_ndjson(server):
    body = {"model": "x", "prompt": "Hi", "options": {"num_predict": 5, "temperature": 0}}
    response = httpx.post(server[0] + "/api/generate", json=body, timeout=60)
    assert response.headers["content-type"] == "application/x-ndjson"
    lines = [json.loads(line) for line in response.text.splitlines()]
    assert len(lines) > 1 and lines[-1]["done"] and not lines[0]["done"]


def test_options_stop_seed_and_num_ctx(client):
    text = client.generate(model="m", prompt="Tell a story", options=GREEDY).response
    stop = text[8:11]
    cut = client.generate(model="m", prompt="Tell a story", options=GREEDY | {"stop": [stop]})
    assert cut.response == text[: text.index(stop)] and cut.done_reason == "stop"
    sampled = {"temperature": 1.0, "top_k": 20, "top_p": 0.9, "seed": 3, "num_predict": 20}
    assert (
        client.generate(model="m", prompt="Hi", options=sampled).response
        == client.generate(model="m", prompt="Hi", options=sampled).response
    )
    # a prompt longer than a 16-token context: cut as Ollama's runner cuts it (its first 4 tokens and BOS,
    # then its end, to 16 - (16 - 5) // 2 = 11 tokens), or with truncate false a 400
    long = "Tell a story about the sea and the sky and the wind and the rain"
    cut = client.generate(model="m", prompt=long, options={"num_ctx": 16, "temperature": 0})
    assert cut.prompt_eval_count == 11 and cut.done_reason == "length" and cut.eval_count == 5
    refused = httpx.post(
        client._client.base_url.join("/api/generate"),
        timeout=60,
        json={"model": "m", "prompt": long, "options": {"num_ctx": 16}, "truncate": False, "stream": False},
    )
    assert refused.status_code == 400 and "context holds 16" in refused.json()["error"]


def test_empty_chat_loads_the_model_as_ollama_does(client):
    response = client.chat(model="llama3.2", messages=[])
    assert response.done and response.done_reason == "load" and response.message.content == ""
    for keep_alive in (0, "0", "0s", "0m"):  # how front-ends ask to unload: answered as Ollama does
        assert client.chat(model="llama3.2", messages=[], keep_alive=keep_alive).done_reason == "unload"
        assert client.generate(model="llama3.2", keep_alive=keep_alive).done_reason == "unload"
    assert client.chat(model="llama3.2", messages=[], keep_alive="5m").done_reason == "load"
    assert client.chat(model="llama3.2", messages=[], keep_alive=-1).done_reason == "load"


def test_tags_show_version_and_probe(client, server):
    models = client.list().models
    assert [m.model for m in models] == ["tiny-target:latest"]
    assert models[0].details.family == "llama" and models[0].details.format == "gguf" and models[0].size > 0
    listed = httpx.get(server[0] + "/api/tags").json()["models"][0]
    assert listed["capabilities"] == ["completion", "tools"] and listed["details"]["context_length"] == 8192
    shown = client.show("tiny-target")
    assert shown.details.parameter_size == "213.6K" and "start_header_id" in shown.template
    assert shown.modelinfo["general.architecture"] == "llama"
    # every header key, as Ollama gives them: long arrays empty, the name and chat template left out
    assert shown.modelinfo["llama.attention.head_count_kv"] == 2 and shown.modelinfo["tokenizer.ggml.model"] == "gpt2"
    assert shown.modelinfo["llama.rope.freq_base"] > 0 and shown.modelinfo["tokenizer.ggml.tokens"] == []
    assert "general.name" not in shown.modelinfo and "tokenizer.chat_template" not in shown.modelinfo
    # parameters as Ollama lays them out (Go's "%-30s %#v"), which clients parse; the license layer
    assert shown.parameters.splitlines()[0] == f'{"stop":<30} "<|start_header_id|>"'
    assert shown.license.startswith("Synthetic weights made by ollama-spec")
    assert shown.modelfile.startswith('# Modelfile generated by "ollama show"\nFROM ')
    assert "PARAMETER stop <|eot_id|>" in shown.modelfile and 'LICENSE """Synthetic' in shown.modelfile
    tensors = httpx.post(server[0] + "/api/show", json={"model": "tiny-target"}).json()["tensors"]
    assert {"name": "token_embd.weight", "type": "F32", "shape": [64, 512]} in tensors  # ggml order, as Ollama's
    assert httpx.get(server[0] + "/api/version").json()["version"]
    assert httpx.get(server[0] + "/").text == "Ollama is running"
    assert httpx.head(server[0] + "/").status_code == 200
    assert httpx.get(server[0] + "/api/ps").json()["models"][0]["context_length"] == 2048


def test_short_header_arrays_are_shown_as_ollama_shows_them(tmp_path):
    """Arrays of up to 5 items (general.languages, general.tags) are read whatever their key."""
    from gguf import GGUFWriter

    from ollama_spec.models.gguf_info import read_model_info
    from ollama_spec.server.http.ollama.models import _model_info

    writer = GGUFWriter(tmp_path / "m.gguf", arch="llama")
    writer.add_array("general.languages", ["en", "fr"])
    writer.add_array("general.tags", [f"t{i}" for i in range(6)])
    writer.add_array("llama.rope.dimension_sections", [16, 24, 24, 0])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    shown = _model_info(read_model_info(tmp_path / "m.gguf").metadata)
    assert shown["general.languages"] == ["en", "fr"] and shown["general.tags"] == []
    assert shown["llama.rope.dimension_sections"] == [16, 24, 24, 0]


def test_routes_not_served_say_why_and_the_store_routes_act(client, server):
    with pytest.raises(ollama.ResponseError) as error:
        client.delete("llama3.2")  # a real delete now: the store has no such model
    assert error.value.status_code == 404 and error.value.error == "model 'llama3.2' not found"
    with pytest.raises(ollama.ResponseError) as error:
        client.push("llama3.2")
    assert error.value.status_code == 501 and "--upstream" in error.value.error
    assert httpx.post(server[0] + "/api/nothing", json={}, timeout=60).status_code == 404


def test_bodies_are_json_whatever_the_content_type_says(server):
    """Ollama's own examples post with `curl -d '{...}'`, which labels the body as a form."""
    body = json.dumps({"model": "m", "prompt": "Hi", "stream": False, "options": {"num_predict": 3}})
    response = httpx.post(
        server[0] + "/api/generate",
        content=body,
        timeout=60,
        headers={"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert response.status_code == 200 and response.json()["eval_count"] == 3


def test_generate_context_carries_an_exchange_into_the_next(client, server):
    first = client.generate(model="m", prompt="My name is Bob.", options=GREEDY | {"num_predict": 8})
    assert len(first.context) == first.prompt_eval_count + first.eval_count
    second = client.generate(model="m", prompt="What is my name?", context=first.context, options=GREEDY)
    alone = client.generate(model="m", prompt="What is my name?", options=GREEDY)
    # the context's tokens come first (once: the new prompt's BOS is dropped)
    assert second.prompt_eval_count == len(first.context) + alone.prompt_eval_count - 1
    assert second.context[: len(first.context)] == first.context
    streamed = list(client.generate(model="m", prompt="Hi", stream=True, options=GREEDY | {"num_predict": 4}))
    assert len(streamed[-1].context) == streamed[-1].prompt_eval_count + 4
    bad = httpx.post(server[0] + "/api/generate", json={"model": "m", "prompt": "x", "context": [-1]}, timeout=60)
    assert bad.status_code == 400 and "outside this model's vocabulary" in bad.json()["error"]


def test_num_predict_past_the_context_is_a_cap_as_in_ollama(client):
    """Ollama's boundedNumPredict: front-ends send a fixed num_predict with every request."""
    capped = client.generate(
        model="m", prompt="Once upon a time", options={"num_predict": 5000, "temperature": 0, "num_ctx": 64}
    )
    assert capped.done_reason == "length" and capped.eval_count == 64 - capped.prompt_eval_count
    first = client.generate(model="m", prompt="Hi", options={"num_predict": 20, "num_ctx": 64})
    # a conversation near the end of the window: the next answer gets what room is left
    near = client.generate(model="m", prompt="More", context=first.context, options={"num_predict": 50, "num_ctx": 64})
    assert near.done_reason == "length" and near.prompt_eval_count + near.eval_count == 64


def test_a_history_longer_than_the_context_loses_its_oldest_messages(client):
    """As Ollama's chatPrompt: the system messages and the latest message always stay."""
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"Turn {i}: " + "words and more " * 60}
        for i in range(16)
    ]
    history = [MESSAGES[0], *turns, {"role": "user", "content": "And now?"}]
    options = {"num_predict": 4, "temperature": 0}
    answer = client.chat(model="m", messages=history, options=options)
    assert answer.prompt_eval_count < 2048
    # the same answer as the history cut by hand after the first message that no longer fits
    start = next(start for start in range(2, len(history)) if _fits(client, [MESSAGES[0], *history[start:]]))
    kept = [MESSAGES[0], *history[start:]]
    alone = client.chat(model="m", messages=kept, options=options)
    assert (answer.prompt_eval_count, answer.message.content) == (alone.prompt_eval_count, alone.message.content)
    refused = _chat(client, history, truncate=False)
    assert refused.status_code == 400 and "context holds 2048" in refused.json()["error"]


def _fits(client, messages) -> bool:
    return _chat(client, messages, truncate=False).status_code == 200


def _chat(client, messages, **fields) -> httpx.Response:  # the ollama client does not send truncate
    body = {"model": "m", "messages": messages, "stream": False, "options": {"num_predict": 1}} | fields
    return httpx.post(str(client._client.base_url) + "/api/chat", json=body, timeout=60)


def test_raw_mode_returns_no_context_and_refuses_a_system(client):
    raw = client.generate(model="m", prompt="Once upon a time", raw=True, options=GREEDY | {"num_predict": 3})
    assert not raw.context and raw.eval_count == 3
    with pytest.raises(ollama.ResponseError) as error:
        client.generate(model="m", prompt="Once", raw=True, system="Be brief.")
    assert error.value.error == "raw mode does not support template, system, or context"


def test_a_template_override_lays_out_the_prompt(client):
    options = GREEDY | {"num_predict": 8}
    plain = client.generate(model="m", prompt="The capital of France is", template="{{ .Prompt }}", options=options)
    raw = client.generate(model="m", prompt="The capital of France is", raw=True, options=options)
    assert (plain.prompt_eval_count, plain.response) == (raw.prompt_eval_count, raw.response)
    assert plain.context[: plain.prompt_eval_count] and plain.done_reason == "length"
    template = "{{ if .System }}System: {{ .System }}\n{{ end }}User: {{ .Prompt }}\nAssistant:{{ .Response }} END"
    laid_out = client.generate(model="m", prompt="Hi", system="Be brief.", template=template, options=options)
    by_hand = client.generate(model="m", prompt="System: Be brief.\nUser: Hi\nAssistant:", raw=True, options=options)
    assert (laid_out.prompt_eval_count, laid_out.response) == (by_hand.prompt_eval_count, by_hand.response)


def test_a_template_nested_deep_renders_as_go_renders_it(client):
    """1,000 and 20,000 nested ifs (300 KB of template): the prompt as Go's text/template lays it out, never a 500."""
    options = GREEDY | {"num_predict": 2}
    by_hand = client.generate(model="m", prompt="System: brief\nUser: Hi", raw=True, options=options)
    for depth in (1_000, 20_000):
        template = "{{ if .System }}" * depth + "System: {{ .System }}\n" + "{{ end }}" * depth + "User: {{ .Prompt }}"
        nested = client.generate(model="m", prompt="Hi", system="brief", template=template, options=options)
        assert (nested.prompt_eval_count, nested.response) == (by_hand.prompt_eval_count, by_hand.response)
    with pytest.raises(ollama.ResponseError) as unclosed:
        client.generate(model="m", prompt="Hi", template="{{ if .System }}" * 1_000 + "x", options=options)
    assert unclosed.value.status_code == 400 and "{{ end }}" in unclosed.value.error


def test_a_chat_of_20000_messages_is_tokenized_in_pieces(client, server, monkeypatch):
    """Its 1.4 MB prompt never reaches llama.cpp's tokenizer whole (whose cost grows with the square of the
    special tokens in one text: 20,000 messages took 16.5 s there); the latest turns that fit are answered."""
    from llama_cpp._internals import LlamaModel

    sizes: list[int] = []
    tokenize = LlamaModel.tokenize

    def recorded(self, text, add_bos, special):
        sizes.append(len(text))
        return tokenize(self, text, add_bos, special)

    monkeypatch.setattr(LlamaModel, "tokenize", recorded)
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": f"message {i} hello"} for i in range(20_000)]
    answer = client.chat(model="m", messages=[*messages, {"role": "user", "content": "Hi"}], options=GREEDY)
    assert answer.done and 0 < answer.prompt_eval_count <= server[1].serving.served.engine.target.n_ctx
    assert sum(sizes) > 1_000_000 and max(sizes) <= 64 * 1024


def test_ps_reports_the_pair_and_what_is_on_a_gpu(server):
    models = httpx.get(server[0] + "/api/ps").json()["models"]
    engine = server[1].serving.served.engine
    assert models[0]["size"] == engine.target_model.info.file_size + engine.draft_model.info.file_size
    assert models[0]["size_vram"] == 0  # these tests load on the CPU
    assert httpx.head(server[0] + "/api/ps").status_code == 200


def test_gpu_bytes_are_the_offloaded_share_of_the_layers(server, monkeypatch):
    from ollama_spec.server.http.ollama import models as routes

    engine = server[1].serving.served.engine
    size, blocks = engine.target_model.info.file_size, engine.target_model.info.block_count
    monkeypatch.setattr(routes, "gpu_offload_supported", lambda: True)
    assert routes._on_gpu(engine.target_model, engine.target, False) == size  # -1: every layer
    monkeypatch.setattr(engine.target, "settings", replace(engine.target.settings, n_gpu_layers=1))
    assert routes._on_gpu(engine.target_model, engine.target, False) == size // (blocks + 1)


def test_penalty_options_change_the_answer_and_keep_it_the_targets(client, server):
    """Ollama's repeat_penalty and friends (llama.cpp's penalties), applied under speculation: the
    drafted answer is the target alone's penalized one."""
    plain = client.generate(model="x", prompt="Once upon a time", options=GREEDY)
    options = GREEDY | {"repeat_penalty": 2.0, "repeat_last_n": 32, "frequency_penalty": 1.0}
    penalized = client.generate(model="x", prompt="Once upon a time", options=options)
    assert penalized.response != plain.response
    engine = server[1].serving.served.engine
    request = server[1].serving.served.build_request(
        Asked(
            prompt="Once upon a time",
            max_tokens=40,
            temperature=0,
            penalties={"repeat_penalty": 2.0, "repeat_last_n": 32, "frequency_penalty": 1.0},
        )
    )
    alone = engine.generate(request, use_draft=False)
    assert "".join(alone) == penalized.response


def test_requests_are_read_as_ollama_reads_them(client, server):
    """Ollama checks option types, not ranges, and llama.cpp makes sense of any value; a JSON null
    leaves a field's default; roles are lowercased, and developer is system; think takes levels."""
    plain = client.generate(model="x", prompt="Once upon a time", options=GREEDY).response
    for odd in (
        {"repeat_penalty": 0},
        {"top_p": 0, "temperature": 1},
        {"temperature": -1},
        {"min_p": 5, "temperature": 1},
        {"num_ctx": 0},
        {"top_k": -1},
    ):
        assert client.generate(model="x", prompt="Once upon a time", options=GREEDY | odd).response == plain, odd
    long = client.generate(model="x", prompt="Once upon a time", options={"num_predict": -3, "temperature": 0})
    assert long.done_reason == "length" and long.eval_count > 16  # below 0: until the context is full
    with pytest.raises(ollama.ResponseError, match="num_predict 0"):
        client.generate(model="x", prompt="hi", options={"num_predict": 0})
    url = server[0]
    nulls = {
        "model": "x",
        "prompt": "Once upon a time",
        "stream": None,
        "raw": None,
        "truncate": None,
        "logprobs": None,
        "options": GREEDY,
    }
    answered = httpx.post(url + "/api/generate", json=nulls, timeout=60)
    assert answered.status_code == 200 and json.loads(answered.text.splitlines()[-1])["done"]  # streamed
    messages = [
        {"role": "Developer", "content": "Be brief."},
        {"role": "USER", "content": "Hi"},
        {"role": "assistant", "content": None, "tool_calls": None},
        {"role": "user", "content": "Go on"},
    ]
    chat = httpx.post(
        url + "/api/chat",
        json={"model": "x", "messages": messages, "stream": False, "think": "max", "options": GREEDY},
        timeout=60,
    )
    assert chat.status_code == 400 and "does not support thinking" in chat.json()["error"]  # read, then refused
    chat = httpx.post(
        url + "/api/chat", json={"model": "x", "messages": messages, "stream": False, "options": GREEDY}, timeout=60
    )
    assert chat.status_code == 200 and chat.json()["message"]["role"] == "assistant"


def test_model_info_is_json_whatever_the_header_holds():
    from ollama_spec.models.gguf_header import SkippedArray
    from ollama_spec.server.http.ollama.models import _model_info

    shown = _model_info(
        {
            "a.inf": float("inf"),
            "a.nan": float("nan"),
            "a.short": (1.0, float("-inf")),
            "a.long": tuple(range(6)),
            "a.skipped": SkippedArray(8, 100_000),
            "a.text": "x",
        }
    )
    assert shown == {"a.inf": None, "a.nan": None, "a.short": [1.0, None], "a.long": [], "a.skipped": [], "a.text": "x"}
    json.dumps(shown, allow_nan=False)


def test_an_embedding_model_is_embedding_alone_as_ollama_says():
    from types import SimpleNamespace

    from ollama_spec.server.http.ollama.models import _capabilities

    info = SimpleNamespace(architecture="bert", metadata={"bert.pooling_type": 1}, chat_template=None)
    assert _capabilities(None, info) == ["embedding"]
