"""decoding/parameters.resolve: the one precedence (a request, the flags, the Modelfile, the defaults) for
sampling, K and the answer's length, whichever face asks."""

from ollama_spec.decoding.loop import MAX_NUM_SPECULATIVE_TOKENS
from ollama_spec.decoding.parameters import as_layer, resolve, resolve_k, sampling_settings
from ollama_spec.decoding.sampling import SamplingSettings

PARAMS = {"temperature": 0.9, "top_k": 5, "repeat_penalty": 1.2, "stop": ["END"], "num_predict": 7}


def test_each_value_comes_from_the_first_layer_that_sets_it():
    chosen = resolve(PARAMS, {"temperature": 0.3, "seed": 4, "stop": ("STOP",)})
    sampling = chosen.sampling
    assert (sampling.temperature, sampling.top_k, sampling.top_p, sampling.seed) == (0.3, 5, 0.9, 4)
    assert sampling.penalties.repeat_penalty == 1.2
    assert (chosen.stop, chosen.max_tokens, chosen.unlimited) == (("STOP", "END"), 7, False)
    request = sampling_settings({"temperature": 0.1, "top_p": None}, as_layer(sampling))
    assert (request.temperature, request.top_k, request.top_p, request.seed) == (0.1, 5, 0.9, 4)
    assert resolve({}).sampling == SamplingSettings()  # nothing set anywhere: the defaults


def test_k_none_given_is_auto_and_the_modelfile_k_beats_draft_num_predict():
    assert resolve_k({"draft_num_predict": 6}, {}) == 6
    assert resolve_k({"draft_num_predict": 6}, {"num_speculative_tokens": None}) is None  # -k auto
    assert resolve_k({"draft_num_predict": 6, "num_speculative_tokens": 3}, {}) == 3  # a preset's K
    assert resolve_k({"draft_num_predict": 6, "num_speculative_tokens": "auto"}, {}) is None
    assert resolve_k({"draft_num_predict": -1}, {}) is None
    said = []
    assert resolve_k({}, {"num_speculative_tokens": 10**5}, said.append) == MAX_NUM_SPECULATIVE_TOKENS
    assert said[0].startswith(f"-k 100000 is capped to {MAX_NUM_SPECULATIVE_TOKENS}")


def test_the_answers_length_a_flag_sets_as_given_and_the_models_minus_one_fills_the_context():
    assert resolve({"num_predict": -1}).unlimited and resolve({"num_predict": -1}).max_tokens is None
    assert resolve({"num_predict": -1}, {"num_predict": 0}).max_tokens == 0  # the Request refuses it, loudly
    assert resolve({"num_predict": 0}).max_tokens is None
