"""Fill in the middle (code completion between a prefix and a suffix): the prompt layout, the
speculative answer, and both servers' `suffix` (Ollama's /api/generate, OpenAI's /v1/completions)."""

import httpx
import ollama
import pytest
from openai import OpenAI

from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.errors import InvalidSetting
from ollama_spec.models.resolve import resolve_model
from tests.builders.variants import build_coder_target
from tests.conftest import build_pair_store, engine_settings
from tests.greedy import assert_greedy_identical
from tests.serving import running_server

PREFIX, SUFFIX = "def add(a, b):\n    ", "\n\nprint(add(1, 2))"
GREEDY = SamplingSettings(temperature=0)


@pytest.fixture(scope="module")
def coder(tmp_path_factory):
    """tiny-coder (tiny-target with Qwen2.5-Coder-style markers), drafted by tiny-draft."""
    root = tmp_path_factory.mktemp("coder-store")
    build_pair_store(root, "tiny")
    name = build_coder_target(root)
    with Engine(resolve_model(name, str(root)), resolve_model("tiny-draft", str(root)), engine_settings()) as engine:
        yield engine


def test_the_prompt_is_prefix_suffix_middle(coder):
    pre, suf, mid = coder.target.fill_in_the_middle_tokens()
    tokens = coder.prompt_tokens(Request(PREFIX, suffix=SUFFIX))
    tokenize = coder.target.tokenize
    assert tokens == [
        coder.target.bos_token,
        pre,
        *tokenize(PREFIX, add_bos=False, special=False),
        suf,
        *tokenize(SUFFIX, add_bos=False, special=False),
        mid,
    ]


def test_the_drafted_middle_is_the_target_alones(coder):
    request = Request(PREFIX, suffix=SUFFIX, max_tokens=40, sampling=GREEDY, ignore_eos=True)
    alone = coder.generate(request, use_draft=False)
    "".join(alone)
    drafted = coder.generate(request)
    "".join(drafted)
    assert drafted.result.speculation.drafted > 0
    assert_greedy_identical(coder, request, alone.result.tokens, drafted.result.tokens)


def test_a_model_without_markers_refuses_a_suffix(baseline_engine):
    with pytest.raises(InvalidSetting, match="no fill-in-the-middle tokens"):
        baseline_engine.prompt_tokens(Request(PREFIX, suffix=SUFFIX))


def test_both_servers_take_a_suffix(coder, baseline_engine):
    with running_server(coder) as (url, _):
        client = ollama.Client(host=url)
        answer = client.generate(
            model="qwen2.5-coder", prompt=PREFIX, suffix=SUFFIX, options={"temperature": 0, "num_predict": 12}
        )
        expected = coder.generate(Request(PREFIX, suffix=SUFFIX, max_tokens=12, sampling=GREEDY))
        assert answer.response == "".join(expected)
        assert "insert" in client.show("qwen2.5-coder").capabilities
        completion = OpenAI(base_url=url + "/v1", api_key="x").completions.create(
            model="m", prompt=PREFIX, suffix=SUFFIX, max_tokens=12, temperature=0
        )
        assert completion.choices[0].text == answer.response
    with running_server(baseline_engine) as (url, _):
        refused = httpx.post(url + "/api/generate", json={"model": "m", "prompt": PREFIX, "suffix": SUFFIX}, timeout=60)
        assert refused.status_code == 400 and "no fill-in-the-middle tokens" in refused.json()["error"]
        assert "insert" not in ollama.Client(host=url).show("m").capabilities
