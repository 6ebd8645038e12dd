"""LoadedModel on a real (tiny) GGUF: what the slot pool relies on when it saves and restores cells."""

import numpy as np

from ollama_spec.llama.model import LoadedModel, LoadSettings


def test_a_saved_sequence_restored_in_another_slot_continues_as_the_original(tiny_models):
    target, _ = tiny_models
    with LoadedModel(target.path, LoadSettings(n_ctx=512, n_threads=1, n_seq=2)) as model:
        text = model.tokenize("The lighthouse keeper found a bottle on the rocks", add_bos=True, special=False)
        model.eval(text, seq=0)
        state = model.save_sequence(0)
        assert isinstance(state, bytes) and len(state) > 0
        assert model.restore_sequence(1, state, text)
        assert model.cached_of(1) == text
        # the restored cells, not a re-read: the next row is the one the original sequence gives
        original, restored = model.eval([42], seq=0), model.eval([42], seq=1)
        np.testing.assert_allclose(restored, original, rtol=1e-5, atol=1e-5)
