"""Log-probabilities of the emitted tokens: the pure helper, the loop's tokens against the target
alone's, and both APIs' shapes through the official clients."""

import math

import numpy as np
import ollama
import pytest
from openai import OpenAI
from scipy.special import log_softmax

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings, token_logprobs
from ollama_spec.engine.engine import Request
from tests.serving import serving_tiny_pair

GREEDY = SamplingSettings(temperature=0)
PROMPT = "Write a function that returns the sum"  # no near-tie in its first 40 greedy tokens


def test_token_logprobs_is_the_log_softmax_and_its_best():
    logits = np.array([1.0, 3.0, -2.0, 2.5, 0.0], dtype=np.float32)
    logprob, top = token_logprobs(logits, 3, 2)
    exact = log_softmax(logits.astype(np.float64))
    assert logprob == pytest.approx(exact[3]) and [t for t, _ in top] == [1, 3]
    assert [lp for _, lp in top] == pytest.approx([exact[1], exact[3]])
    masked = logits.copy()
    masked[1] = -np.inf  # a grammar's mask: the distribution is over what is left
    logprob, top = token_logprobs(masked, 3, 10)
    assert logprob == pytest.approx(log_softmax(np.delete(logits, 1).astype(np.float64))[2])
    assert 1 not in [t for t, _ in top] and len(top) == 4
    assert token_logprobs(logits, 0, 0)[1] == ()


def test_the_loops_logprobs_are_the_target_alones(baseline_engine, spec_engine):
    def scored(engine, **kwargs):
        request = Request(PROMPT, max_tokens=40, sampling=GREEDY, logprobs=3, **kwargs)
        generation = engine.generate(request)
        "".join(generation)
        return generation.result

    alone = scored(baseline_engine)
    drafted = scored(spec_engine, speculation=SpeculationSettings(4))
    assert [t.id for t in alone.scored] == alone.tokens == drafted.tokens == [t.id for t in drafted.scored]
    assert any(t.from_draft for t in drafted.scored)
    # a batch of K+1 and a single token round differently: equal up to that
    assert [t.logprob for t in drafted.scored] == pytest.approx([t.logprob for t in alone.scored], abs=0.02)
    assert all(t.top[0][0] == t.id and len(t.top) == 3 for t in alone.scored)  # greedy: the chosen is the best
    target = baseline_engine.target
    target.truncate(0)
    prompt = baseline_engine.prompt_tokens(Request(PROMPT))
    first = log_softmax(target.eval(prompt)[-1].astype(np.float64))
    assert alone.scored[0].logprob == pytest.approx(first[alone.tokens[0]], abs=1e-4)


def test_under_a_grammar_logprobs_are_of_the_masked_distribution_greedy_too(spec_engine):
    """Greedy leaves a row unmasked when its best token is allowed (the argmax is the same); logprobs
    must still be read from the masked row, as sampling reads them, with no forbidden alternative."""
    grammar = "root ::= [a-z ]+"  # most rows' best token is allowed: greedy would leave them unmasked

    def scored(temperature):
        request = Request(
            PROMPT,
            max_tokens=8,
            logprobs=5,
            grammar=grammar,
            sampling=SamplingSettings(temperature=temperature, top_k=1, seed=0),
        )
        generation = spec_engine.generate(request, use_draft=False)
        "".join(generation)
        return generation.result.scored

    greedy, sampled = scored(0.0), scored(1.0)  # top_k 1: the same tokens
    assert [t.id for t in greedy] == [t.id for t in sampled]
    assert [t.logprob for t in greedy] == pytest.approx([t.logprob for t in sampled], abs=1e-4)
    assert [t.top for t in greedy] == [t.top for t in sampled]


@pytest.fixture(scope="module")
def server(tiny_models):
    with serving_tiny_pair(tiny_models) as served:
        yield served


def test_openai_logprobs_as_the_docs_show(server):
    client = OpenAI(base_url=server[0] + "/v1", api_key="x")
    messages = [{"role": "user", "content": PROMPT}]
    response = client.chat.completions.create(
        model="m", messages=messages, max_tokens=12, temperature=0, logprobs=True, top_logprobs=2
    )
    content = response.choices[0].logprobs.content
    assert len(content) == response.usage.completion_tokens == 12
    assert "".join(e.token for e in content) == response.choices[0].message.content
    assert all(e.logprob <= 0 and len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob >= e.logprob for e in content)
    assert bytes(content[0].bytes).decode() == content[0].token
    streamed = client.chat.completions.create(
        model="m", messages=messages, max_tokens=12, temperature=0, logprobs=True, stream=True
    )
    pieces = [
        e
        for chunk in streamed
        if chunk.choices and chunk.choices[0].logprobs
        for e in chunk.choices[0].logprobs.content
    ]
    assert [e.token for e in pieces] == [e.token for e in content]
    plain = client.chat.completions.create(model="m", messages=messages, max_tokens=4, temperature=0)
    assert plain.choices[0].logprobs is None
    legacy = client.completions.create(model="m", prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=3)
    lp = legacy.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert lp.text_offset[0] == 0 and all(len(top) <= 3 for top in lp.top_logprobs)
    pieces = [
        c.choices[0].logprobs
        for c in client.completions.create(
            model="m", prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=1, stream=True
        )
        if c.choices and c.choices[0].logprobs
    ]
    assert [o for piece in pieces for o in piece.text_offset] == lp.text_offset  # chunk after chunk, one count


def _scored(data: bytes, *alternatives: bytes) -> dict:
    def entry(raw):
        return {"token": raw.decode(errors="replace"), "logprob": -0.5, "bytes": list(raw)}

    return entry(data) | {"top_logprobs": [entry(a) for a in (data, *alternatives)]}


def test_legacy_logprobs_name_parts_of_a_character_as_openai_does():
    """中 spelled by three byte tokens (a SentencePiece model's byte fallback, a split emoji): each
    part is named "bytes:\\x..", so alternatives do not collide as one U+FFFD, and the offsets are
    characters of the text, the character's parts all at its start."""
    from ollama_spec.server.protocol.logprobs import LegacyLogprobs

    legacy = LegacyLogprobs()
    first = legacy([_scored(b"a"), _scored(b"\xe4", b"\xe5", b"\xe6")], [True, True])
    rest = legacy(
        [_scored(b"\xb8"), _scored(b"\xad"), _scored(b"<|eot_id|>"), _scored(b"b")], [True, True, False, True]
    )
    assert first["tokens"] + rest["tokens"] == ["a", "bytes:\\xe4", "bytes:\\xb8", "bytes:\\xad", "<|eot_id|>", "b"]
    assert len(first["top_logprobs"][1]) == 3
    # "a中b": b is the text's 3rd character; a control token's text is not in the text
    assert first["text_offset"] + rest["text_offset"] == [0, 1, 1, 1, 2, 2]


def test_ollama_logprobs(server):
    client = ollama.Client(host=server[0])
    response = client.generate(
        model="m", prompt=PROMPT, logprobs=True, top_logprobs=1, options={"num_predict": 6, "temperature": 0}
    )
    assert len(response.logprobs) == 6 and all(math.isfinite(e.logprob) for e in response.logprobs)
    assert all(e.top_logprobs[0].token == e.token for e in response.logprobs)
    parts = list(
        client.chat(
            model="m",
            messages=[{"role": "user", "content": PROMPT}],
            logprobs=True,
            stream=True,
            options={"num_predict": 6, "temperature": 0},
        )
    )
    assert sum(len(p.logprobs or []) for p in parts) == 6
