"""Engine behaviour around the loop: prompt building, metadata fixes, draft cache reuse."""

from dataclasses import replace

import pytest

from ollama_spec.decoding.loop import SpeculationSettings
from ollama_spec.decoding.sampling import SamplingSettings
from ollama_spec.engine.engine import Engine, Request
from ollama_spec.errors import InvalidSetting
from ollama_spec.models.gguf_info import read_model_info
from ollama_spec.models.resolve import ResolvedModel, resolve_model
from ollama_spec.synthetic.catalog import PAIRS
from ollama_spec.synthetic.models import make_weights, write_gguf
from ollama_spec.synthetic.tokenizer import build_vocabulary
from tests.conftest import engine_settings

GREEDY = SamplingSettings(temperature=0)


def test_chat_template_is_applied_unless_raw(baseline_engine):
    chat = baseline_engine.prompt_tokens(Request("Hello", system="Be brief."))
    raw = baseline_engine.prompt_tokens(Request("Hello", raw=True))
    target = baseline_engine.target
    text = target.detokenize(chat)
    assert chat[0] == target.bos_token and chat.count(target.bos_token) == 1
    assert "Be brief." in text and "Hello" in text
    assert chat.index(target.tokenize("<|start_header_id|>", add_bos=False, special=True)[0]) == 1
    assert raw == target.tokenize("Hello", add_bos=True, special=False)


def test_eval_returns_the_last_rows_asked_for(baseline_engine):
    target = baseline_engine.target
    tokens = target.tokenize("Once upon a time there was", add_bos=True, special=False)
    baseline_engine.clear_cache()
    every = target.eval(tokens, logits="all")
    baseline_engine.clear_cache()
    last_three = target.eval(tokens, logits=3)
    assert last_three.shape == (3, target.n_vocab)
    assert abs(last_three - every[-3:]).max() < 1e-3  # a batch's rows, whichever are copied out
    for wrong in (0, len(tokens) + 1, "first"):
        with pytest.raises(ValueError, match="rows"):
            target.eval(tokens[:2], logits=wrong)
    baseline_engine.clear_cache()


def test_draft_never_rereads_the_prompt(tiny_models, monkeypatch):
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        evaluated = []
        real_decode = engine.draft.decode_many
        monkeypatch.setattr(  # the step loop's passes: one sequence's tokens each, alone
            engine.draft, "decode_many", lambda items: evaluated.append(len(items[0][1])) or real_decode(items)
        )
        generation = engine.generate(
            Request(
                "Once upon a time", max_tokens=200, ignore_eos=True, sampling=GREEDY, speculation=SpeculationSettings(4)
            )
        )
        "".join(generation)
        prompt = generation.result.prompt_tokens
    assert evaluated[0] == prompt + 1  # the prompt once, with the first token (the target's prompt pass gave it)
    assert max(evaluated[1:]) <= 2  # afterwards: the new tokens only


def _gap_model(tmp_path):
    spec = PAIRS["tiny"]
    vocab = build_vocabulary(spec.vocab_size, spec.n_merges)
    weights = make_weights(spec.arch, vocab.size, spec.recipe, spec.draft_layers)
    path = tmp_path / "gap.gguf"
    write_gguf(
        path,
        name="gap",
        arch=spec.arch,
        n_layer=spec.arch.n_layer,
        vocab=vocab,
        weights=weights,
        dtype="F32",
        llama3_metadata_gap=True,
    )
    return ResolvedModel(name="gap", path=path, info=read_model_info(path))


def test_llama3_metadata_gap_is_corrected_at_load(tmp_path, tiny_models, baseline_engine):
    gap = _gap_model(tmp_path)
    assert gap.info.pre_tokenizer is None and gap.info.eot_id is None
    with Engine(gap, None, engine_settings()) as engine:
        assert engine.extra_stop_ids == {511}  # <|eot_id|>
        text = "In 2024, 123456 numbers... and  spaces\n\nnew lines"
        # with the llama-bpe override the gap model splits text exactly like the complete model
        assert engine.target.tokenize(text, add_bos=True, special=False) == baseline_engine.target.tokenize(
            text, add_bos=True, special=False
        )
        assert engine.is_end_of_turn(511) and engine.is_end_of_turn(508)


def test_system_layer_is_the_default_system_prompt(tiny_models, baseline_engine):
    from dataclasses import replace

    with_system = replace(tiny_models[0], system="You are terse.")
    engine = Engine.__new__(Engine)
    engine.target_model, engine.target = with_system, baseline_engine.target
    text = engine.target.detokenize(engine.prompt_tokens(Request("Hi")))
    assert "You are terse." in text
    assert "You are terse." not in engine.target.detokenize(engine.prompt_tokens(Request("Hi", system="")))


def test_quantized_kv_cache_is_allocated_as_asked(tmp_path):
    """--kv-type reaches llama.cpp: the logged KV buffer shrinks to q8_0's 34 bytes per 32 values."""
    import re

    from ollama_spec.llama import log as llama_log
    from ollama_spec.llama import model as runtime
    from ollama_spec.synthetic.models import Architecture, WeightRecipe

    arch = Architecture(n_embd=128, n_layer=2, n_head=4, n_kv_head=2, n_ff=256)
    vocab = build_vocabulary(512, 200)
    path = tmp_path / "kv.gguf"
    write_gguf(
        path,
        name="kv",
        arch=arch,
        n_layer=2,
        vocab=vocab,
        weights=make_weights(arch, 512, WeightRecipe(seed=2), 1),
        dtype="F32",
    )
    sizes = {}
    for kv_type in ("f16", "q8_0"):
        llama_log.clear_log()
        with runtime.LoadedModel(path, runtime.LoadSettings(n_ctx=1024, n_threads=1, kv_type=kv_type)) as model:
            model.eval(model.tokenize("hello world", add_bos=True, special=False))
        line = next(line for line in llama_log.recent_log() if "KV buffer size" in line)
        sizes[kv_type] = float(re.search(r"= +([\d.]+) MiB", line).group(1))
    assert sizes["q8_0"] / sizes["f16"] == pytest.approx(34 / 64, rel=0.03)  # the log rounds to 0.01 MiB


def test_greedy_margins_match_the_target_alone(baseline_engine):
    import numpy as np

    request = Request("The quick brown fox", max_tokens=20, sampling=GREEDY, ignore_eos=True)
    generation = baseline_engine.generate(request)
    "".join(generation)
    prompt = baseline_engine.prompt_tokens(request)
    margins = baseline_engine.greedy_margins(prompt, generation.result.tokens, chunk=7)
    target = baseline_engine.target
    target.truncate(0)
    logits = target.eval(prompt)[-1]
    top2 = np.sort(logits)[-2:]
    assert len(margins) == 20 and all(m >= 0 for m in margins)
    assert margins[0] == pytest.approx(top2[1] - top2[0], abs=1e-3)


def test_chosen_in_a_batch_finds_the_targets_own_choice_and_nothing_else(baseline_engine):
    import numpy as np

    request = Request("The quick brown fox", max_tokens=12, sampling=GREEDY, ignore_eos=True)
    generation = baseline_engine.generate(request)
    "".join(generation)
    prompt, tokens = baseline_engine.prompt_tokens(request), generation.result.tokens
    at = 6
    # the target's own token is its choice in a batch too (margins here are far above rounding)
    assert baseline_engine.chosen_in_a_batch(prompt, tokens, at, tokens[at], max_batch=4) == 2
    # a token it ranks low is its choice in no batch shape: a verification error would look like this
    target = baseline_engine.target
    target.truncate(0)
    logits = target.eval([*prompt, *tokens[:at]])[-1]
    worst = int(np.argmin(logits))
    assert baseline_engine.chosen_in_a_batch(prompt, tokens, at, worst, max_batch=4) is None


def test_a_speculative_runs_own_batches_are_replayed_and_explain_its_choice_only(baseline_engine, spec_engine):
    """A greedy run traces its target batches; replayed on the target alone, they give the run's own
    token at every position (margins here are far above rounding) and never a token it ranks low."""
    import numpy as np

    request = Request(
        "The quick brown fox",
        max_tokens=16,
        sampling=GREEDY,
        ignore_eos=True,
        speculation=SpeculationSettings(3),
        trace_batches=True,
    )
    generation = spec_engine.generate(request)
    "".join(generation)
    prompt, tokens = spec_engine.prompt_tokens(request), generation.result.tokens
    batches = generation.result.speculation.batches
    cached = generation.result.speculation.prompt_cached  # kept from an earlier test's request: read in one batch
    assert batches[0] == (cached, len(prompt) - cached) and any(size > 2 for _, size in batches[1:])
    assert all(later[0] > start for start, later in zip((s for s, _ in batches), batches[1:]))
    for at in (0, 5, 11):
        assert baseline_engine.chosen_as_batched(prompt, tokens, batches, at, tokens[at])
    target = baseline_engine.target
    target.truncate(0)
    worst = int(np.argmin(target.eval([*prompt, *tokens[:5]])[-1]))
    assert not baseline_engine.chosen_as_batched(prompt, tokens, batches, 5, worst)
    untraced = spec_engine.generate(replace(request, trace_batches=False))
    "".join(untraced)
    assert untraced.result.speculation.batches is None


def test_stop_strings_match_special_tokens_which_are_never_shown(baseline_engine, spec_engine):
    """Greedy, "Once upon a time" makes the tiny target write `<|end_header_id|>` as its 12th token:
    Ollama's Llama 3 params stop there; without that stop the token's text stays out of the answer."""
    end_header = baseline_engine.target.tokenize("<|end_header_id|>", add_bos=False, special=True)[0]
    free = Request("Once upon a time", max_tokens=40, ignore_eos=True, sampling=GREEDY)
    generation = baseline_engine.generate(free)
    text = "".join(generation)
    assert end_header in generation.result.tokens and "<|" not in text
    position = generation.result.tokens.index(end_header)
    for engine in (baseline_engine, spec_engine):
        stopped = engine.generate(replace(free, stop=("<|end_header_id|>",)))
        assert "".join(stopped) == stopped.result.text
        assert stopped.result.finish_reason == "stop"
        assert stopped.result.tokens == generation.result.tokens[: position + 1]
        assert text.startswith(stopped.result.text) and stopped.result.text


def test_a_recurrent_model_runs_alone_and_is_refused_as_a_pair(tmp_path, tiny_models):
    """Mamba's cache can only be emptied: alone it generates (twice, so the reset works), with a draft it is refused."""
    from ollama_spec.errors import IncompatibleDraft
    from ollama_spec.models.resolve import resolve_model
    from tests.builders.recurrent import write_mamba_gguf

    path = tmp_path / "mamba.gguf"
    write_mamba_gguf(path)
    mamba = resolve_model(str(path))
    with Engine(mamba, None, engine_settings()) as engine:
        first = engine.generate(Request("Hello there", raw=True, max_tokens=8, ignore_eos=True, sampling=GREEDY))
        second = engine.generate(Request("Hello there", raw=True, max_tokens=8, ignore_eos=True, sampling=GREEDY))
        assert "".join(first) == "".join(second)
        assert len(first.result.tokens) == 8
    with pytest.raises(IncompatibleDraft, match="recurrent model"):
        Engine(mamba, tiny_models[1], engine_settings())


def test_a_prompt_that_extends_the_cache_evaluates_only_the_new_tokens(tiny_models, monkeypatch):
    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        evaluated = {"target": [], "draft": []}
        for name in evaluated:  # noqa: PLC0206 - each model's list is bound into its own lambda
            model = getattr(engine, name)
            real_decode = model.decode_many  # the step loop's passes: one sequence's tokens each, alone
            monkeypatch.setattr(
                model,
                "decode_many",
                lambda items, real_decode=real_decode, calls=evaluated[name]: (
                    calls.append(len(items[0][1])) or real_decode(items)
                ),
            )

        def run(prompt):
            for calls in evaluated.values():
                calls.clear()
            generation = engine.generate(Request(prompt, raw=True, max_tokens=20, sampling=GREEDY))
            return "".join(generation), generation.result

        first_text, first = run("Once upon a time")
        second_prompt = "Once upon a time" + first_text + " and then"
        second_text, second = run(second_prompt)
        cached = second.speculation.prompt_cached
        assert cached >= first.prompt_tokens
        assert evaluated["target"][0] == second.prompt_tokens - cached  # only what follows the cached part
        # the draft: that too, and the tokens of the first answer it had not read (its last step, one
        # token short of max_tokens, drafted nothing)
        assert evaluated["draft"][0] <= second.prompt_tokens - cached + 2
        engine.clear_cache()
        fresh_text, fresh = run(second_prompt)
        assert evaluated["target"][0] == second.prompt_tokens and fresh.speculation.prompt_cached == 0
        assert fresh_text == second_text and fresh.tokens == second.tokens


def test_a_conversation_renders_every_message(baseline_engine):
    from ollama_spec.prompting.messages import ChatMessage

    messages = (ChatMessage("user", "Hi there"), ChatMessage("assistant", "Hello!"), ChatMessage("user", "Bye"))
    text = baseline_engine.target.detokenize(
        baseline_engine.prompt_tokens(Request(messages=messages, system="Be kind."))
    )
    assert [text.index(s) for s in ("Be kind.", "Hi there", "Hello!", "Bye")] == sorted(
        text.index(s) for s in ("Be kind.", "Hi there", "Hello!", "Bye")
    )
    one = baseline_engine.prompt_tokens(Request("Hi there", system="Be kind."))
    assert baseline_engine.prompt_tokens(Request(messages=(ChatMessage("user", "Hi there"),), system="Be kind.")) == one
    with pytest.raises(InvalidSetting, match="unknown message role 'wizard'"):
        ChatMessage("wizard", "hi")


class _InterruptedOnce(list):
    """A cache record whose first `extend` is cut by Ctrl-C: llama_decode returned, the record did not grow."""

    def __init__(self, items):
        super().__init__(items)
        self.armed = True

    def extend(self, items):
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        super().extend(items)


def test_a_ctrl_c_between_decode_and_its_record_leaves_a_usable_cache(baseline_engine):
    """`chat`: Ctrl-C stops an answer, the next turn goes on (llama.cpp's cache must hold what the
    record says, not one token more, or the next decode fails)."""
    target = baseline_engine.target
    prompt = target.tokenize("The quick brown fox jumps over", add_bos=True, special=False)
    target.truncate(0)
    expected = target.eval(prompt)[-1]
    target.truncate(0)
    target.eval(prompt[:-2])
    target.cached = _InterruptedOnce(target.cached)
    with pytest.raises(KeyboardInterrupt):
        target.eval(prompt[-2:-1])  # in llama.cpp's cache, not in the record
    try:
        got = target.eval(prompt[len(target.cached) :])[-1]  # the next turn carries on from the record
    finally:
        target.cached = list(target.cached)
    assert got == pytest.approx(expected, abs=1e-3)
    target.truncate(0)


def _greedy(engine, prompt, **kwargs):
    generation = engine.generate(Request(prompt, raw=True, max_tokens=30, ignore_eos=True, sampling=GREEDY, **kwargs))
    "".join(generation)
    return generation.result.tokens


def test_a_lora_adapter_is_applied_as_llama_cpp_applies_it(store_copy, tmp_path):
    from llama_cpp import Llama

    from tests.greedy import assert_greedy_identical
    from tests.stores import lora_variant

    adapter = lora_variant(store_copy, "tiny-lora", tmp_path)
    base, lora, draft = (resolve_model(name, str(store_copy)) for name in ("tiny-target", "tiny-lora", "tiny-draft"))
    prompt = "Once upon a time"
    with Engine(base, None, engine_settings()) as engine:
        plain = _greedy(engine, prompt)
    with Engine(lora, None, engine_settings()) as engine:
        alone = _greedy(engine, prompt)
        tokens = engine.target.tokenize(prompt, add_bos=True, special=False)
    assert alone != plain  # the adapter changes what the model says
    llm = Llama(model_path=str(lora.path), lora_path=str(adapter), n_ctx=512, n_threads=1, verbose=False)
    try:
        reference = []
        for token in llm.generate(tokens, temp=0.0, top_k=1):
            reference.append(int(token))
            if len(reference) == len(alone):
                break
    finally:
        llm.close()
    assert alone == reference  # what llama-cpp-python's own lora_path gives
    with Engine(lora, draft, engine_settings()) as engine:  # the draft has no adapter: fewer accepted, same answer
        for k in (None, 4):
            drafted = _greedy(engine, prompt, speculation=SpeculationSettings(k))
            assert_greedy_identical(
                engine, Request(prompt, raw=True, max_tokens=30, ignore_eos=True, sampling=GREEDY), alone, drafted
            )


def test_an_adapter_llama_cpp_refuses_at_load_is_one_clear_error(store_copy, tmp_path):
    """resolve_model refuses a LoRA for other shapes from the headers (test_resolve); one that reaches
    llama.cpp anyway is refused by it, with its reason, and nothing stays loaded."""
    from ollama_spec.errors import ModelLoadError
    from ollama_spec.synthetic.models import Architecture
    from tests.builders.writers import write_lora_gguf

    path = tmp_path / "wide.gguf"
    write_lora_gguf(path, arch=Architecture(n_embd=96, n_layer=2, n_head=4, n_kv_head=2, n_ff=160), n_layer=2)
    base = resolve_model("tiny-target", str(store_copy))
    unchecked = replace(base, adapters=(read_model_info(path, read_vocab=False),))
    with pytest.raises(ModelLoadError, match=r"could not apply the LoRA adapter wide.gguf to sha256-.*incorrect shape"):
        Engine(unchecked, None, engine_settings())


def test_an_empty_prompt_is_a_clear_error(baseline_engine, monkeypatch):
    """A raw empty prompt to a model that adds no BOS token has no token at all to continue."""
    monkeypatch.setattr(baseline_engine, "prompt_tokens", lambda request: [])
    with pytest.raises(InvalidSetting, match="^the prompt is empty: give some text for the model to continue$"):
        "".join(baseline_engine.generate(Request("", raw=True, sampling=GREEDY)))
