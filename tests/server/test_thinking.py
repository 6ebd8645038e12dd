"""Thinking models over both APIs: thinking apart from the answer (Ollama's `thinking`, OpenAI's
`reasoning`), `think: false` told to the template, a refusal for a model that does not think."""

import dataclasses

import httpx
import ollama
import pytest
from openai import OpenAI

from ollama_spec.engine.engine import Engine, Request
from tests.conftest import engine_settings
from tests.serving import running_server, serving_tiny_pair

HEADER = (
    "{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{%- endfor %}"
)
# Qwen3's way: thinking unless enable_thinking is false, which closes an empty block at once.
QWEN3_STYLE = HEADER + (
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)
# DeepSeek-R1's newer way: the template opens the block, the model closes it (and earlier answers
# lose their thinking).
R1_STYLE = (
    "{%- for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n"
    "{{ m.content.split('</think>')[-1] }}<|eot_id|>{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n<think>\\n' }}"
    "{%- endif %}"
)
THOUGHT_THEN_ANSWER = 'root ::= "<think>" "hmm" "</think>" "\\n\\n" "answer"'
USER = [{"role": "user", "content": "How many r are in strawberry?"}]


@pytest.fixture(scope="module")
def servers(tiny_models):
    def serve(template):
        target = tiny_models[0]
        target = dataclasses.replace(target, info=dataclasses.replace(target.info, chat_template=template))
        return Engine(target, tiny_models[1], engine_settings())

    with serve(QWEN3_STYLE) as qwen, serve(R1_STYLE) as r1:
        with running_server(qwen) as qwen_served, running_server(r1) as r1_served:
            yield {"qwen": qwen_served, "r1": r1_served}


def test_openai_reasoning_apart_from_content(servers):
    url, _ = servers["qwen"]
    client = OpenAI(base_url=url + "/v1", api_key="x")
    body = {"model": "qwen3", "messages": USER, "extra_body": {"grammar": THOUGHT_THEN_ANSWER}}
    message = client.chat.completions.create(**body).choices[0].message
    assert message.content == "answer" and message.model_extra["reasoning"] == "hmm"
    assert message.model_extra["reasoning_content"] == "hmm"
    chunks = [c.choices[0].delta for c in client.chat.completions.create(**body, stream=True) if c.choices]
    assert "".join(d.content or "" for d in chunks) == "answer"
    assert "".join((d.model_extra or {}).get("reasoning", "") for d in chunks) == "hmm"


def test_think_false_is_told_to_the_template(servers):
    url, state = servers["qwen"]
    engine = state.serving.served.engine
    prompt = engine.target.detokenize(engine.prompt_tokens(Request("Hi", think=False)), special=True)
    assert prompt.endswith("<think>\n\n</think>\n\n")
    default = engine.target.detokenize(engine.prompt_tokens(Request("Hi")), special=True)
    assert "</think>" not in default
    answer = ollama.Client(host=url).chat(
        model="qwen3", messages=USER, think=False, options={"num_predict": 8, "temperature": 0}
    )
    assert answer.message.content and not answer.message.thinking  # nothing is split off
    effort = OpenAI(base_url=url + "/v1", api_key="x").chat.completions.create(
        model="qwen3", messages=USER, reasoning_effort="none", max_tokens=8, temperature=0
    )
    assert effort.choices[0].message.content == answer.message.content


def test_ollama_thinking_opened_by_the_template(servers):
    url, _ = servers["r1"]
    client = ollama.Client(host=url)
    options = {"num_predict": 12, "temperature": 0}
    response = client.chat(model="deepseek-r1", messages=USER, options=options)
    assert response.message.thinking and response.message.content == ""  # the tiny model never closes it
    parts = list(client.chat(model="deepseek-r1", messages=USER, options=options, stream=True))
    assert "".join(p.message.thinking or "" for p in parts) == response.message.thinking
    generated = client.generate(model="deepseek-r1", prompt=USER[0]["content"], options=options, think=True)
    assert generated.thinking and generated.response == ""
    raw = client.generate(model="deepseek-r1", prompt="Once", raw=True, options=options)
    assert raw.response and not raw.thinking  # no template, nothing to split


def test_a_model_that_does_not_think_refuses_think_true(tiny_models):
    with serving_tiny_pair(tiny_models) as (url, _):
        with pytest.raises(ollama.ResponseError, match="does not support thinking"):
            ollama.Client(host=url).chat(model="m", messages=USER, think=True)
        plain = OpenAI(base_url=url + "/v1", api_key="x").chat.completions.create(
            model="m", messages=USER, reasoning_effort="high", max_tokens=4
        )
        assert plain.choices[0].message.content  # OpenAI clients send reasoning_effort to any model
        assert (
            httpx.post(
                url + "/api/chat", json={"model": "m", "messages": USER, "think": "medium", "stream": False}, timeout=60
            ).status_code
            == 400
        )


def test_responses_keep_the_thinking_out_of_the_output_text(servers):
    url, _ = servers["r1"]
    client = OpenAI(base_url=url + "/v1", api_key="x")
    response = client.responses.create(model="deepseek-r1", input="Hi", max_output_tokens=8, temperature=0)
    assert response.output_text == ""  # the tiny model never closes its thinking
    assert response.output[-1].type == "reasoning" and response.output[-1].content[0].text
    events = list(
        client.responses.create(model="deepseek-r1", input="Hi", max_output_tokens=8, temperature=0, stream=True)
    )
    assert not [e for e in events if e.type == "response.output_text.delta"]
    assert events[-1].response.output[-1].content[0].text == response.output[-1].content[0].text


def test_show_lists_thinking_among_the_capabilities(servers):
    assert "thinking" in ollama.Client(host=servers["qwen"][0]).show("qwen3").capabilities
