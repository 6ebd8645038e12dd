"""The step loop: one thread owns the slots, runs every pass, and learns the passes' costs online."""

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.engine.step_loop import stream
from tests.conftest import engine_settings

GREEDY = SamplingSettings(temperature=0)


def request(prompt, **fields):
    fields = {
        "max_tokens": 24,
        "ignore_eos": True,
        "sampling": GREEDY,
        "speculation": SpeculationSettings(None),
    } | fields
    return Request(prompt, raw=True, **fields)


def run(engine, req):
    ticket, pieces = stream(engine.loop, req, engine.prompt_tokens(req))
    text = "".join(pieces)
    return ticket, text


def test_a_drafting_pair_with_nothing_cached_times_nothing_and_prices_auto_from_its_passes(
    tiny_models, tmp_path, monkeypatch
):
    """serve's way (costs.online): no calibration at load nor before the first request; the loop's own
    passes price -k auto from the first steps on."""
    from ollama_spec.engine import costs as costs_module
    from ollama_spec.engine.calibration import StepCostCache

    def timed(*args, **kwargs):
        raise AssertionError("steps were timed before a request could run")

    monkeypatch.setattr(costs_module, "measure_step_costs", timed)
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=2, n_ctx=512)) as engine:
        engine.costs.cache = StepCostCache(tmp_path / "costs.json")
        engine.costs.online = True
        ticket, text = run(engine, request("The quick brown fox"))
        assert text and ticket.generation.result.speculation.drafted > 0
        policy = ticket.generation.policy
        # priced by the passes (about a millisecond on the tiny pair), not by the prior's shape (a
        # second a pass), and not by its own step times (timed alone, it learns nothing of its own)
        assert policy._priced and policy.costs.verify_s[0] < 0.5


def test_a_long_prompt_is_read_in_chunks_inside_the_other_slots_passes(tiny_models, monkeypatch):
    with Engine(tiny_models[0], tiny_models[1], engine_settings(parallel=2, n_ctx=512)) as engine:
        long_prompt = " ".join(["word"] * 100)  # about 300 tokens
        alone = {
            key: run(engine, req)[0].generation.result.tokens
            for key, req in {"short": request("Once upon a time", max_tokens=40), "long": request(long_prompt)}.items()
        }
        passes = []
        real = engine.target.decode_many

        def decode_many(items):
            passes.append([len(tokens) for _, tokens, _ in items])
            return real(items)

        monkeypatch.setattr(engine.target, "decode_many", decode_many)
        engine.clear_cache()
        with engine.loop.together():
            short = stream(
                engine.loop,
                request("Once upon a time", max_tokens=40),
                engine.prompt_tokens(request("Once upon a time")),
            )
            long = stream(engine.loop, request(long_prompt), engine.prompt_tokens(request(long_prompt)))
        "".join(short[1]), "".join(long[1])
        chunk = engine.generate(request("x"), slot=0).prompt_chunk
        assert chunk and chunk < 300
        # the long prompt's chunks each share a pass with the short request's steps: it never waits
        # for the whole prompt to be read
        shared = [sizes for sizes in passes if len(sizes) == 2 and chunk in sizes]
        assert len(shared) >= 3
        assert all(max(sizes) <= chunk + 1 for sizes in passes[: len(shared)])
        assert short[0].generation.result.tokens == alone["short"]
        assert long[0].generation.result.tokens == alone["long"]
