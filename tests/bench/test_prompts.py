"""The benchmark's prompt sets: built-in by name, or read from a file."""

import pytest

from ollama_spec.bench.prompts import BUILTIN_PROMPTS, REWRITE_PROMPTS, prompts_for
from ollama_spec.errors import InvalidSetting


def test_built_in_sets_by_name_and_a_file_by_path(tmp_path, monkeypatch):
    assert prompts_for(None) == prompts_for("default") == BUILTIN_PROMPTS
    assert prompts_for("rewrite") == REWRITE_PROMPTS
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rewrite").write_text("my own prompt\n")  # a file of that name wins over the set
    assert [p.prompt for p in prompts_for("rewrite")] == ["my own prompt"]
    with pytest.raises(InvalidSetting, match="does not exist"):
        prompts_for("no-such-file.txt")


def test_rewrite_prompts_hold_the_text_their_answers_copy():
    for prompt in REWRITE_PROMPTS:
        body = prompt.prompt.split("\n\n", 1)[1]
        assert len(body) > 250  # long enough that a copied answer is mostly lookups
