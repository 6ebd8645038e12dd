"""`generate`'s options and the model's Ollama `params`/`system` layers, end to end through the CLI.

Models here are tiny-target under other names, each with its own params layer, in a copy of
the tiny store. Sampling settings are told apart by what they do: a setting that leaves one
candidate (temperature 0, top-k 1, top-p 0.01, min-p 1) writes the greedy text whatever the
seed; one that leaves many writes different texts for different seeds.
"""

import json
import shutil

import pytest
from llama_cpp import Llama

from ollama_spec.models.store import Store, find_store_root
from ollama_spec.synthetic.layout import DEFAULT_PARAMS, write_model

PROMPT = "Write a function that returns the sum"
# 11 sentences: 244 prompt tokens with the chat template, so a 256-token context fills after 13
# tokens, none of them a near-tie, an end of turn or a stop string.
LONG_PROMPT = "Write a function that returns the sum of a list. " * 11
BASE = ("--threads", "1", "--no-check", "--json")
MODELS = {
    "cold": {"temperature": 0},
    "top-k-one": {"temperature": 1, "top_k": 1},
    "top-p-tiny": {"temperature": 1, "top_p": 0.01},
    "min-p-one": {"temperature": 1, "min_p": 1.0},
    "short": {"num_predict": 7, "temperature": 0},
    "small-context": {"num_ctx": 256, "temperature": 0},
    "seeded": {"seed": 42, "temperature": 1},
    "repetitive": {"temperature": 0, "repeat_penalty": 2.0, "frequency_penalty": 1.0},
}


def generate(invoke, store, model, *args, prompt=PROMPT):
    result = invoke("generate", model, prompt, *BASE, "--models-dir", store, *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def texts(invoke, store, model, *args, seeds=(1, 2, 3)):
    return [generate(invoke, store, model, "-n", "16", "--seed", seed, *args)["text"] for seed in seeds]


@pytest.fixture(scope="module")
def greedy_text(tiny_store):
    """tiny-target's greedy answer to PROMPT, 16 tokens."""
    from click.testing import CliRunner

    from ollama_spec.cli import cli

    result = CliRunner().invoke(
        cli, ["generate", "tiny-target", PROMPT, *BASE, "-n", "16", "-t", "0", "--models-dir", str(tiny_store)]
    )
    return json.loads(result.stdout)["text"]


@pytest.fixture(scope="module")
def store(tiny_store, greedy_text, tmp_path_factory):
    root = tmp_path_factory.mktemp("params-store") / "models"
    shutil.copytree(tiny_store, root)
    gguf = Store(find_store_root(root)).resolve("tiny-target").gguf_path
    models = [(name, DEFAULT_PARAMS | params, None) for name, params in MODELS.items()]
    models += [
        ("terse", DEFAULT_PARAMS, "You are terse and exact."),
        ("stopping", {"stop": [greedy_text[24:28]], "temperature": 0}, None),
    ]
    for name, params, system in models:
        copy = root.parent / f"{name}.gguf"
        shutil.copy(gguf, copy)  # write_model moves its file into blobs/
        write_model(root, name, copy, params=params, system=system)
    return root


@pytest.mark.parametrize(
    "model, flags",
    [
        ("cold", ()),
        ("top-k-one", ()),
        ("top-p-tiny", ()),
        ("min-p-one", ()),
        ("tiny-target", ("-t", "0")),
        ("tiny-target", ("-t", "1", "--top-k", "1")),
        ("tiny-target", ("-t", "1", "--top-p", "0.01")),
        ("tiny-target", ("-t", "1", "--min-p", "1")),
        ("top-k-one", ("-d", "tiny-draft")),  # through rejection sampling too
    ],
)
def test_settings_that_leave_one_candidate_write_the_greedy_text(invoke, store, greedy_text, model, flags):
    assert texts(invoke, store, model, *flags, seeds=(1, 2)) == [greedy_text, greedy_text]


@pytest.mark.parametrize(
    "model, flags",
    [
        ("tiny-target", ()),  # no params: Ollama's defaults, temperature 0.8
        ("cold", ("-t", "1")),
        ("top-k-one", ("--top-k", "0")),
        ("top-p-tiny", ("--top-p", "1")),
        ("min-p-one", ("--min-p", "0")),
    ],
)
def test_flags_override_the_params_layer(invoke, store, model, flags):
    assert len(set(texts(invoke, store, model, *flags))) > 1


def test_the_same_seed_writes_the_same_text_and_other_seeds_differ(invoke, store):
    # Two seeds may draw the same short text (one CPU's kernels ended two of seeds 5, 6 and 7 alike after
    # 6 tokens), so "other seeds differ" is asked of six seeds: not all of them write one text.
    drafted = texts(invoke, store, "tiny-target", "-t", "1", "-d", "tiny-draft", seeds=(5, 5, 6, 7, 8, 9, 10))
    assert drafted[0] == drafted[1] and len(set(drafted[1:])) > 1
    # a seed in the params layer is used when --seed is not given
    seeded = [generate(invoke, store, "seeded", "-n", "16")["text"] for _ in range(2)]
    same_settings = generate(invoke, store, "tiny-target", "-n", "16", "-t", "1", "--seed", "42")["text"]
    assert seeded[0] == seeded[1] == same_settings
    assert set(texts(invoke, store, "seeded", seeds=(7, 8, 9))) != {seeded[0]}


def test_num_predict_sets_the_length_and_max_tokens_overrides_it(invoke, store):
    short = generate(invoke, store, "short")
    assert (short["generated_tokens"], short["finish_reason"]) == (7, "length")
    assert generate(invoke, store, "short", "-n", "3")["generated_tokens"] == 3


def test_num_ctx_sets_the_context_and_a_full_context_is_said(invoke, store):
    result = invoke("generate", "small-context", LONG_PROMPT, "--threads", "1", "--no-check", "--models-dir", store)
    assert result.exit_code == 0, result.output
    assert result.stderr.strip() == "stopped: the context (256 tokens) is full; raise --ctx for longer output"
    data = generate(invoke, store, "small-context", prompt=LONG_PROMPT)
    assert data["finish_reason"] == "context" and data["prompt_tokens"] + data["generated_tokens"] == 256 + 1
    wider = generate(invoke, store, "small-context", "--ctx", "512", "-n", "20", prompt=LONG_PROMPT)
    assert wider["finish_reason"] == "length" and wider["generated_tokens"] == 20


def test_stop_strings_from_the_params_layer_and_the_flag(invoke, store, greedy_text):
    # "stopping" stops on greedy_text[24:28]; --stop adds to that
    early = greedy_text[10:14]
    assert greedy_text.index(early) == 10 and greedy_text.index(greedy_text[24:28]) == 24 and len(greedy_text) > 30
    assert generate(invoke, store, "stopping", "-n", "16")["text"] == greedy_text[:24]
    assert generate(invoke, store, "stopping", "-n", "16", "--stop", "no such text")["text"] == greedy_text[:24]
    assert generate(invoke, store, "stopping", "-n", "16", "--stop", early)["text"] == greedy_text[:10]
    assert generate(invoke, store, "tiny-target", "-n", "16", "-t", "0", "--stop", early)["text"] == greedy_text[:10]


def llama3_chat(user, system=None):
    """Llama 3's prompt format, written out by hand (Meta's model card), to compare with."""
    turn = "<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>"
    return (
        "<|begin_of_text|>"
        + (turn.format("system", system) if system else "")
        + turn.format("user", user)
        + "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_system_and_raw_shape_the_prompt(invoke, store):
    vocab = Llama(
        model_path=str(Store(find_store_root(store)).resolve("tiny-target").gguf_path), vocab_only=True, verbose=False
    )

    def count(text, special=True):
        return len(vocab.tokenize(text.encode(), add_bos=not special, special=special))

    def prompt_tokens(model, *args):
        return generate(invoke, store, model, "-n", "1", *args)["prompt_tokens"]

    assert prompt_tokens("tiny-target") == count(llama3_chat(PROMPT))
    assert prompt_tokens("tiny-target", "--system", "Be brief.") == count(llama3_chat(PROMPT, "Be brief."))
    assert prompt_tokens("terse") == count(llama3_chat(PROMPT, "You are terse and exact."))  # the system layer
    assert prompt_tokens("terse", "--system", "Be brief.") == count(llama3_chat(PROMPT, "Be brief."))
    assert prompt_tokens("terse", "--system", "") == count(llama3_chat(PROMPT))
    assert prompt_tokens("terse", "--raw") == count(PROMPT, special=False)  # BOS + the text, no template


def test_penalties_from_flags_and_the_params_layer_change_the_text_but_not_speculations(invoke, store, greedy_text):
    flagged = generate(
        invoke, store, "tiny-target", "-n", "16", "-t", "0", "--repeat-penalty", "2", "--frequency-penalty", "1"
    )["text"]
    assert flagged != greedy_text
    assert generate(invoke, store, "repetitive", "-n", "16")["text"] == flagged  # from the params layer
    drafted = generate(invoke, store, "repetitive", "-n", "16", "-d", "tiny-draft", "-k", "3")
    assert drafted["text"] == flagged and drafted["drafted"] > 0
    assert (
        generate(
            invoke,
            store,
            "repetitive",
            "-n",
            "16",
            "--repeat-penalty",
            "1",
            "--frequency-penalty",
            "0",
            "--repeat-last-n",
            "0",
        )["text"]
        == greedy_text
    )


def test_a_bad_penalty_is_one_line(invoke, store):
    result = invoke("generate", "tiny-target", PROMPT, *BASE, "--models-dir", store, "--repeat-penalty", "0")
    assert result.exit_code == 1
    assert result.output.splitlines()[-1] == "Error: repeat_penalty must be > 0 (1 turns it off), got 0.0"
