"""serve's flags reach the server as data (RequestDefaults): laid over each model's params, which they beat,
and under a request's own options, which beat both."""

import json

from ollama_spec.decoding.loop import MAX_NUM_SPECULATIVE_TOKENS, SpeculationSettings
from ollama_spec.planning.devices import system_ram
from ollama_spec.server.serving.defaults import RequestDefaults
from ollama_spec.server.serving.pairs import StorePairs
from ollama_spec.server.serving.request import Asked, build_request
from ollama_spec.server.serving.settings import ServerSettings
from tests.conftest import engine_settings
from tests.stores import variant

PARAMS = {
    "temperature": 0.9,
    "top_k": 5,
    "repeat_penalty": 1.2,
    "draft_num_predict": 6,
    "stop": ["END"],
    "num_predict": 7,
}


def test_the_flags_beat_the_models_params_and_those_beat_ollamas_defaults():
    base = ServerSettings(max_queue=2, aliases=("gpt-4o",))
    settings = RequestDefaults({"temperature": 0.3, "seed": 5, "draft_p_min": 0.2}).over(PARAMS, base)
    sampling = settings.sampling
    assert (sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed) == (0.3, 5, 0.9, 5)
    assert sampling.penalties.repeat_penalty == 1.2 and sampling.penalties.presence_penalty == 0.0
    assert settings.speculation == SpeculationSettings(6, 0.2)  # the model's draft_num_predict: no -k given
    assert (settings.stop, settings.max_tokens) == (("END",), 7)
    assert (settings.max_queue, settings.aliases) == (2, ("gpt-4o",))  # the server's own, as given
    assert RequestDefaults().over({}, base).sampling == ServerSettings().sampling  # nothing set: Ollama's


def test_k_given_beats_draft_num_predict_auto_too_and_is_capped():
    base = ServerSettings()
    assert RequestDefaults({"num_speculative_tokens": 3}).over(PARAMS, base).speculation.num_speculative_tokens == 3
    assert (
        RequestDefaults({"num_speculative_tokens": None}).over(PARAMS, base).speculation.num_speculative_tokens is None
    )
    huge = RequestDefaults().over({"draft_num_predict": 10**5}, base).speculation.num_speculative_tokens
    assert huge == MAX_NUM_SPECULATIVE_TOKENS


def test_the_pairs_proposer_and_ngram_beside_the_draft():
    base = ServerSettings()
    assert RequestDefaults().over({}, base).speculation.proposer == "draft"
    assert RequestDefaults(proposer="draft+ngram").over({}, base).speculation.proposer == "draft+ngram"  # --ngram
    hybrid = RequestDefaults({"ngram_size": 2}, proposer="draft+ngram")
    assert hybrid.over({}, base, "ngram").speculation == SpeculationSettings(  # --pair T=ngram wins
        None, proposer="ngram", ngram_size=2
    )


def test_the_store_is_built_from_plain_data_and_plans_the_flags_over_the_params(store_copy):
    variant(
        store_copy,
        "tuned",
        keep=lambda layer: not layer["mediaType"].endswith(".params"),
        extra=[("params", json.dumps(PARAMS).encode())],
    )
    store = StorePairs(
        models_dir=str(store_copy),
        no_draft=True,
        engine=engine_settings(parallel=1),
        settings=ServerSettings(max_queue=3),
        defaults=RequestDefaults({"temperature": 0.3, "num_speculative_tokens": 4}),
    )
    settings = store.plan("tuned", [system_ram(64)]).settings
    assert (settings.sampling.temperature, settings.sampling.top_k) == (0.3, 5)
    assert (settings.speculation.num_speculative_tokens, settings.stop, settings.max_queue) == (4, ("END",), 3)
    plain = store.plan("tiny-target", [system_ram(64)]).settings  # its params: stop strings only
    assert (plain.sampling.temperature, plain.sampling.top_k, plain.max_tokens) == (0.3, 40, None)


def test_a_requests_own_options_beat_the_flags_and_the_params(baseline_engine):
    settings = RequestDefaults({"temperature": 0.3, "top_p": 0.5}).over(PARAMS, ServerSettings())
    request = build_request(baseline_engine, settings, Asked(prompt="Hi", temperature=0.1, top_k=2))
    assert (request.sampling.temperature, request.sampling.top_k, request.sampling.top_p) == (0.1, 2, 0.5)
    assert request.max_tokens == 7 and "END" in request.stop
