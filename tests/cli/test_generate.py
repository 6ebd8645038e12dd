"""`generate` end to end through the CLI: the same text with and without a draft, --json, -k,
--stats and --compare, one-line errors, seeds, n-gram drafting, --format, --think, piped input
and Ctrl-C. How it loads its models: test_generate_loading.py; its options and a model's params
layer: test_generate_options.py."""

import json

import pytest

from ollama_spec.decoding.loop import DEFAULT_MAX_SPECULATIVE_TOKENS

BASE = ("--threads", "1", "--no-check", "-t", "0")


def gen(invoke, store, *args, **kwargs):
    return invoke("generate", *args, *BASE, "--models-dir", store, **kwargs)


def test_generate_streams_the_same_text_with_and_without_draft(invoke, tiny_store):
    # No near-tie in this answer's first 190 tokens (smallest top-two logit gap 0.04), so any CPU agrees.
    prompt = "Write a function that returns the sum"
    alone = gen(invoke, tiny_store, "tiny-target", prompt, "-n", "30")
    drafted = gen(invoke, tiny_store, "tiny-target", prompt, "-n", "30", "--draft", "tiny-draft", "-k", "3")
    assert alone.exit_code == 0 and drafted.exit_code == 0
    assert alone.stdout == drafted.stdout and len(alone.stdout.strip()) > 10


def test_prompt_from_stdin_and_json(invoke, tiny_store):
    result = gen(
        invoke,
        tiny_store,
        "tiny-target",
        "-d",
        "tiny-draft",
        "--json",
        "-n",
        "20",
        "-t",
        "0",
        "-k",
        "5",
        input="The quick brown fox",
    )
    data = json.loads(result.stdout)
    assert data["target"] == "tiny-target:latest" and data["draft"] == "tiny-draft:latest"
    assert data["generated_tokens"] == 20 and data["finish_reason"] == "length"
    assert data["drafted"] >= data["accepted"] > 0
    assert len(data["acceptance_by_position"]) == 5


def test_k_defaults_to_auto_and_reports_the_ks_it_chose(invoke, tiny_store):
    result = gen(
        invoke, tiny_store, "tiny-target", "The quick brown fox", "-d", "tiny-draft", "--json", "-n", "20", "-t", "0"
    )
    data = json.loads(result.stdout)
    assert sum(data["k_chosen"].values()) == data["steps"] - 1  # the prompt's own pass drafts nothing
    assert all(0 <= int(k) <= DEFAULT_MAX_SPECULATIVE_TOKENS for k in data["k_chosen"])
    fixed = json.loads(
        gen(
            invoke,
            tiny_store,
            "tiny-target",
            "The quick brown fox",
            "-d",
            "tiny-draft",
            "--json",
            "-n",
            "20",
            "-t",
            "0",
            "-k",
            "3",
        ).stdout
    )
    # K=3 but where fewer than 4 tokens are left to write (each step adds one token to its drafts):
    # at most 3 steps at the end, each drafting only what max_tokens leaves room for
    capped = {k: n for k, n in fixed["k_chosen"].items() if k != "3"}
    assert set(capped) <= {"0", "1", "2"} and sum(capped.values()) <= 3
    assert fixed["text"] == data["text"]


def test_stats_and_compare_go_to_stderr(invoke, tiny_store):
    result = gen(invoke, tiny_store, "tiny-target", "Hi", "-d", "tiny-draft", "--compare", "--stats", "-n", "24")
    assert result.exit_code == 0
    assert "target alone:" in result.stderr and "speed-up" in result.stderr
    assert "outputs are token-identical" in result.stderr
    assert "tokens per target pass" in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ("nope", "hi"),
            "Error: model 'nope' not found in {store} (from --models-dir); pull it with 'ollama-spec pull nope'",
        ),
        (
            ("tiny-target", "hi", "-d", "tiny-alien"),
            (
                "Error: tiny-alien:latest cannot draft for tiny-target:latest: BOS differs: add_bos True / id 507 in target, "
                "add_bos True / id 1019 in draft; vocab sizes 512 vs 1024 differ by more than 128"
            ),
        ),
        (
            ("tiny-target", "hi", "-d", "tiny-draft", "-k", "0"),
            "Error: -k/--num-speculative-tokens must be at least 1 or 'auto', got 0",
        ),
        (("tiny-target", "hi", "--temperature", "-1"), "Error: temperature must be >= 0, got -1.0"),
        (("tiny-target", "hi", "--top-p", "0"), "Error: top-p must be in (0, 1], got 0.0"),
        (("tiny-target", "hi", "--top-p", "1.01"), "Error: top-p must be in (0, 1], got 1.01"),
        (("tiny-target", "hi", "--ctx", "0"), "Error: --ctx must be a positive number of tokens, got 0"),
        (("tiny-target", "hi", "--max-tokens", "0"), "Error: --max-tokens must be at least 1, got 0"),
        (
            ("tiny-target", "word " * 400, "--ctx", "256"),
            "Error: the prompt is 1214 tokens but the context holds 256; raise --ctx or shorten it",
        ),
    ],
)
def test_errors_are_one_line(invoke, tiny_store, args, message):
    result = invoke("generate", *args, "--threads", "1", "--no-check", "--models-dir", tiny_store)
    assert result.exit_code == 1, result.output
    assert result.output.strip().splitlines()[-1] == message.format(store=tiny_store)
    assert "Traceback" not in result.output


@pytest.mark.parametrize("seed", ["-1", "-7"])
def test_a_negative_seed_means_random_as_in_ollama(invoke, tiny_store, seed):
    result = gen(invoke, tiny_store, "tiny-target", "hi", "-d", "tiny-draft", "-t", "1", "--seed", seed, "-n", "8")
    assert result.exit_code == 0, result.output


def test_compare_needs_a_draft(invoke, tiny_store):
    result = gen(invoke, tiny_store, "tiny-target", "hi", "--compare")
    assert result.exit_code == 2 and "--compare needs --draft" in result.output


def test_compare_labels_a_near_tie_and_warns_on_a_real_difference():
    from ollama_spec.cli.results import format_comparison
    from ollama_spec.engine.engine import Result

    base = Result(tokens=[1, 2, 3, 4], total_seconds=1.0, first_token_seconds=0.1)
    other = Result(tokens=[1, 2, 9, 9], total_seconds=0.5, first_token_seconds=0.1)
    tie = format_comparison(base, other, greedy=True, margins=[3.0, 2.0, 0.005, 1.0])
    assert tie.splitlines()[-1].startswith(
        "outputs part at token 2, where the target's two best logits are 0.0050 apart"
    )
    real = format_comparison(base, other, greedy=True, margins=[3.0, 2.0, 0.5, 1.0])
    assert real.splitlines()[-1] == "WARNING: outputs differ from token 2 on"
    rounded = format_comparison(base, other, greedy=True, margins=[3.0, 2.0, 0.5, 1.0], batch_size=3)
    assert rounded.splitlines()[-1].startswith(
        "outputs part at token 2, where the target itself picks the "
        "speculative token in a batch of 3 (logit margin 0.500)"
    )
    replayed = format_comparison(base, other, greedy=True, margins=[3.0, 2.0, 0.026, 1.0], replayed=True)
    assert replayed.splitlines()[-1].startswith(
        "outputs part at token 2, where the target itself picks the speculative token on a cache built in "
        "this run's own batches (logit margin 0.026)"
    )
    same = format_comparison(base, base, greedy=True)
    assert same.splitlines()[-1] == "outputs are token-identical"


def test_compare_tells_no_speed_up_from_a_run_too_short_to_time_and_notes_a_busy_machine(
    invoke, tiny_store, monkeypatch
):
    from ollama_spec.cli.results import format_comparison
    from ollama_spec.engine.engine import Result

    one = Result(tokens=[1], total_seconds=0.1, first_token_seconds=0.1)
    base = Result(tokens=[1, 2, 3, 4], total_seconds=1.0, first_token_seconds=0.1)
    assert "no speed-up to tell (a run wrote under 2 tokens)" in format_comparison(base, one, greedy=False)
    monkeypatch.setattr("os.getloadavg", lambda: (64.0, 64.0, 64.0))
    result = gen(invoke, tiny_store, "tiny-target", "Hi", "-d", "tiny-draft", "--compare", "-n", "8")
    assert result.exit_code == 0 and "note: this machine is busy (load average 64.0" in result.stderr


def test_think_on_a_model_that_does_not_think_is_noted(invoke, tiny_store):
    result = gen(invoke, tiny_store, "tiny-target", "Hi", "--think", "-n", "3")
    assert result.exit_code == 0
    assert "note: tiny-target:latest is not a thinking model" in result.stderr


def test_draft_ngram_needs_no_draft_model(invoke, tiny_store):
    text = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. The quick"
    alone = gen(invoke, tiny_store, "tiny-target", text, "--raw", "-t", "0", "-n", "30", "--json")
    lookup = gen(invoke, tiny_store, "tiny-target", text, "--raw", "-t", "0", "-n", "30", "--json", "-d", "ngram")
    assert lookup.exit_code == 0, lookup.output
    alone, lookup = json.loads(alone.stdout), json.loads(lookup.stdout)
    assert lookup["draft"] == "ngram" and lookup["drafted"] > 0
    assert lookup["text"] == alone["text"]


SCHEMA = {
    "type": "object",
    "required": ["ok", "size"],
    "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["small", "large"]}},
}


def test_format_keeps_the_output_to_json(invoke, tiny_store, tmp_path):
    schema_file = tmp_path / "answer.schema.json"
    schema_file.write_text(json.dumps(SCHEMA))
    for given in (json.dumps(SCHEMA), str(schema_file)):
        result = gen(invoke, tiny_store, "tiny-target", "hello", "-d", "tiny-draft", "-t", "0", "--format", given)
        assert result.exit_code == 0, result.output
        assert set(json.loads(result.stdout)) == {"ok", "size"}
    free = gen(invoke, tiny_store, "tiny-target", "hello", "-t", "0", "-n", "20", "--format", "json")
    assert free.exit_code == 0 and free.stdout.lstrip().startswith("{")


@pytest.mark.parametrize(
    "given, message",
    [
        ("missing.json", "cannot read 'missing.json': No such file or directory"),
        ('{"type": ', "the schema is not valid JSON"),
        ("[1, 2]", "a JSON schema must be an object"),
    ],
)
def test_bad_formats_are_one_line_errors(invoke, tiny_store, given, message):
    result = gen(invoke, tiny_store, "tiny-target", "hello", "--format", given)
    assert result.exit_code == 1 and message in result.output
    assert "Traceback" not in result.output


def test_think_flags(invoke, tiny_store):
    """The tiny model does not think: the flags are accepted and change nothing (its template reads no
    enable_thinking). What --no-think tells a thinking template: tests/test_server_thinking.py."""
    plain = gen(invoke, tiny_store, "tiny-target", "hello", "-n", "8")
    for flag in ("--think", "--no-think"):
        result = gen(invoke, tiny_store, "tiny-target", "hello", "-n", "8", flag)
        assert result.exit_code == 0 and result.stdout == plain.stdout


def test_the_speed_line_says_what_its_rate_measures():
    from ollama_spec.cli.results import format_stats
    from ollama_spec.engine.engine import Result

    result = Result(
        tokens=[1] * 9, finish_reason="length", prompt_tokens=5, total_seconds=7.92, first_token_seconds=7.57
    )  # 8 tokens after the first in 0.35 s
    assert format_stats(result, speculative=False) == (
        "9 tokens in 7.92 s (decode 22.9 tok/s after a 7.57 s first token; prompt 5 tokens; finished: length)"
    )


def test_piped_text_goes_before_the_prompt_and_empty_input_is_refused(tiny_store, tmp_path):
    """As `ollama run`: `cat file | ollama-spec generate M "explain this"` reads the file first."""
    import os
    import subprocess
    import sys

    notes = tmp_path / "notes.txt"
    notes.write_text("The capital of France")
    command = [
        sys.executable,
        "-m",
        "ollama_spec",
        "generate",
        "tiny-target",
        "--raw",
        "--json",
        "-n",
        "1",
        *BASE,
        "--models-dir",
        str(tiny_store),
    ]
    env = {**os.environ, "PYTHONPATH": os.getcwd()}

    def prompt_tokens(*args, stdin):
        with open(stdin) as source:
            run = subprocess.run([*command, *args], stdin=source, capture_output=True, text=True, env=env, timeout=120)
        return run

    alone = json.loads(prompt_tokens("is", stdin=os.devnull).stdout)["prompt_tokens"]
    piped = json.loads(prompt_tokens("is", stdin=notes).stdout)["prompt_tokens"]
    assert piped > alone
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    refused = prompt_tokens(stdin=empty)
    assert refused.returncode == 2 and "standard input was empty" in refused.stderr
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("caf\xe9 au lait".encode("latin-1"))  # not UTF-8: read with U+FFFD, no traceback
    assert prompt_tokens("is", stdin=latin1).returncode == 0


def test_ctrl_c_ends_the_partial_answers_line(invoke, tiny_store, monkeypatch):
    from ollama_spec.engine.generation import Generation

    def interrupted(self):
        yield "a partial answer"
        raise KeyboardInterrupt

    monkeypatch.setattr(Generation, "__iter__", interrupted)
    result = gen(invoke, tiny_store, "tiny-target", "Hi", "-n", "5")
    assert result.exit_code == 130
    assert result.stdout == "a partial answer\n" and result.stderr.strip() == "Interrupted."


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_ngram_beside_a_draft_needs_a_draft_model(invoke, tiny_store, command):
    args = ("tiny-target", "Hi") if command == "generate" else ("tiny-target",)
    result = invoke(command, *args, "--ngram", "--models-dir", tiny_store, "--no-check", input="Hi\n")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "Error: --ngram needs --draft: it looks the text up beside a draft model" in result.stderr


def test_compare_warms_both_up_before_timing_either(invoke, tiny_store, monkeypatch):
    """The first run after loading is slower than the next: --compare first runs a few untimed tokens
    with the target alone and with the draft, so neither timed run pays for the load."""
    from ollama_spec.engine.engine import Engine

    runs = []
    real = Engine.generate

    def recording(self, request, *, use_draft=True, slot=0):
        runs.append((request.max_tokens, use_draft))
        return real(self, request, use_draft=use_draft, slot=slot)

    monkeypatch.setattr(Engine, "generate", recording)
    result = gen(invoke, tiny_store, "tiny-target", "Hi", "-d", "tiny-draft", "--compare", "-n", "40")
    assert result.exit_code == 0, result.output
    assert runs == [(16, False), (16, True), (40, False), (40, True)]
