"""OllamaDraftModel inside llama-cpp-python's own speculative path."""

from llama_cpp import Llama

from ollama_spec.integrations.llama_cpp_python import OllamaDraftModel, ollama_model_path


def test_adapter_drafts_and_keeps_the_target_output(tiny_store):
    target_path = ollama_model_path("tiny-target", str(tiny_store))
    kwargs = {"n_ctx": 1024, "n_threads": 1, "verbose": False, "seed": 1}
    plain = Llama(model_path=target_path, **kwargs)
    # Raw "Hello" is continued with no near-tie (top-two logit gap < 0.02) for 150 tokens: any CPU agrees.
    expected = plain("Hello", max_tokens=40, temperature=0)["choices"][0]["text"]
    draft = OllamaDraftModel("tiny-draft", models_dir=str(tiny_store), num_pred_tokens=4, n_threads=1)
    calls = []
    real_call = draft.__call__

    class Spy(OllamaDraftModel):
        def __call__(self, input_ids, /, **kw):
            out = real_call(input_ids, **kw)
            calls.append(len(out))
            return out

    draft.__class__ = Spy
    with_draft = Llama(model_path=target_path, draft_model=draft, logits_all=True, **kwargs)
    text = with_draft("Hello", max_tokens=40, temperature=0)["choices"][0]["text"]
    assert text == expected
    assert calls and max(calls) == 4
    draft.close()


def test_draft_proposals_match_the_draft_models_greedy_choice(tiny_store):
    draft = OllamaDraftModel("tiny-draft", models_dir=str(tiny_store), num_pred_tokens=3, n_threads=1)
    prompt = draft.model.tokenize("Once upon a time", add_bos=True, special=False)
    import numpy as np

    first = draft(np.array(prompt, dtype=np.intc))
    again = draft(np.array(prompt, dtype=np.intc))  # cache reuse must not change the answer
    extended = draft(np.array(prompt + [int(first[0])], dtype=np.intc))
    assert list(first) == list(again) and len(first) == 3
    assert list(extended[:2]) == list(first[1:])
    assert draft.model.n_past == len(prompt) + 1 + 2  # its input and the drafts it read (all but the last)
    draft.close()


def test_accepted_drafts_are_not_read_again(tiny_store):
    import numpy as np

    draft = OllamaDraftModel("tiny-draft", models_dir=str(tiny_store), num_pred_tokens=4, n_threads=1)
    prompt = draft.model.tokenize("Once upon a time", add_bos=True, special=False)
    first = [int(t) for t in draft(np.array(prompt, dtype=np.intc))]
    read = []
    real_eval = draft.model.eval
    draft.model.eval = lambda tokens, **kw: read.append(len(tokens)) or real_eval(tokens, **kw)
    # The target accepted two drafts and chose its own third token: only that one is new to the draft.
    second = draft(np.array(prompt + first[:2] + [first[2] + 1], dtype=np.intc))
    assert read[0] == 1 and len(second) == 4
    draft.model.eval = real_eval
    draft.reset()
    fresh = draft(np.array(prompt + first[:2] + [first[2] + 1], dtype=np.intc))
    assert list(fresh) == list(second)  # the same drafts as from a cold cache
    draft.close()


def test_a_model_with_an_adapter_layer_is_not_given_as_its_base_blob(store_copy, tmp_path):
    import pytest

    from ollama_spec.errors import UnusableModel
    from ollama_spec.integrations.llama_cpp_python import ollama_adapter_paths
    from tests.stores import lora_variant

    lora_variant(store_copy, "tiny-lora", tmp_path)
    with pytest.raises(
        UnusableModel, match="tiny-lora:latest has 1 LoRA adapter layer.*lora_path=ollama_adapter_paths"
    ):
        ollama_model_path("tiny-lora", str(store_copy))
    [adapter] = ollama_adapter_paths("tiny-lora", str(store_copy))
    assert "/blobs/sha256-" in adapter and ollama_adapter_paths("tiny-target", str(store_copy)) == []
