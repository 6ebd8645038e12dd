"""The native reference row: how llama-speculative-simple is called and its report read."""

import os
import re

import pytest

from ollama_spec.bench.native import _command, _report, run_native_row
from ollama_spec.bench.prompts import Prompt
from ollama_spec.bench.settings import BenchSettings
from ollama_spec.errors import InvalidSetting

# What llama-speculative-simple prints at the end of a run (llama.cpp's own wording).
REPORT = """
0.32.792.276 I encoded    4 tokens in    0.500 seconds, speed:    8.000 t/s
0.32.792.277 I decoded   64 tokens in    2.000 seconds, speed:   32.000 t/s
0.32.792.278 I n_draft   = 3
0.32.792.278 I n_predict = 64
0.32.792.278 I n_drafted = 53
0.32.792.278 I n_accept  = 47
"""


def fake_binary(tmp_path, body, *, exit_status=0, silent_runs=0):
    """A stand-in that prints `body` and exits with `exit_status`, after `silent_runs` runs that exit 0
    without their report (as llama.cpp's logger now and then loses it); each run counted in `runs`."""
    path = tmp_path / "llama-speculative-simple"
    runs = tmp_path / "runs"
    path.write_text(
        f'#!/bin/sh\necho "$@" > {tmp_path / "args"}\necho run >> {runs}\n'
        f"if [ $(wc -l < {runs}) -le {silent_runs} ]; then echo 'main: loaded' >&2; exit 0; fi\n"
        f"cat <<'EOF' >&2\n{body}\nEOF\nexit {exit_status}\n"
    )
    os.chmod(path, 0o755)
    return path


def runs(tmp_path):
    return len((tmp_path / "runs").read_text().splitlines())


def test_native_row_reads_llama_cpps_report(tmp_path, tiny_models):
    target, draft = tiny_models
    binary = fake_binary(tmp_path, REPORT)
    settings = BenchSettings(ks=(3,), max_tokens=64, runs=1, n_threads=2)
    row = run_native_row(binary, target, draft, 3, [Prompt("p", "hi")], {"p": "<|start_header_id|>hi"}, settings)
    assert row.tokens_per_second == 32.0 and row.drafted == 53 and row.accepted == 47
    args = (tmp_path / "args").read_text().split()
    assert args[args.index("--spec-draft-n-max") + 1] == "3" and args[args.index("-t") + 1] == "2"
    assert "--ignore-eos" in args and str(target.path) in args and str(draft.path) in args


def test_a_run_that_lost_its_report_is_made_again(tmp_path, tiny_models):
    target, draft = tiny_models
    binary = fake_binary(tmp_path, REPORT, silent_runs=2)
    settings = BenchSettings(ks=(3,), max_tokens=64, runs=1, n_threads=2)
    row = run_native_row(binary, target, draft, 3, [Prompt("p", "hi")], {"p": "hi"}, settings)
    assert runs(tmp_path) == 3 and row.tokens_per_second == 32.0 and row.accepted == 47


def test_a_run_that_never_reports_stops_after_three_tries(tmp_path, tiny_models):
    target, draft = tiny_models
    binary = fake_binary(tmp_path, REPORT, silent_runs=3)
    settings = BenchSettings(ks=(3,), max_tokens=64, runs=1, n_threads=2)
    with pytest.raises(InvalidSetting) as raised:
        run_native_row(binary, target, draft, 3, [Prompt("p", "hi")], {"p": "hi"}, settings)
    assert str(raised.value) == (
        "llama-speculative-simple ended without its report on prompt 'p' in 3 runs (exit 0): main: loaded"
    )
    assert runs(tmp_path) == 3


def test_a_report_without_its_counts_is_a_lost_report(tmp_path, tiny_models):
    target, draft = tiny_models
    binary = fake_binary(tmp_path, REPORT.split("I n_draft ")[0])
    settings = BenchSettings(ks=(3,), max_tokens=64, runs=1, n_threads=2)
    with pytest.raises(InvalidSetting, match="ended without its report"):
        run_native_row(binary, target, draft, 3, [Prompt("p", "hi")], {"p": "hi"}, settings)
    assert runs(tmp_path) == 3


def test_a_failed_run_is_not_made_again(tmp_path, tiny_models):
    target, draft = tiny_models
    settings = BenchSettings(ks=(3,), max_tokens=8, runs=1)
    with pytest.raises(InvalidSetting, match="exit 1"):
        run_native_row(
            fake_binary(tmp_path, REPORT, exit_status=1), target, draft, 3, [Prompt("p", "hi")], {"p": "hi"}, settings
        )
    assert runs(tmp_path) == 1


def test_native_row_errors_are_one_line(tmp_path, tiny_models):
    target, draft = tiny_models
    settings = BenchSettings(ks=(3,), max_tokens=8, runs=1)
    with pytest.raises(InvalidSetting, match="does not exist: build it with scripts/build-native-speculative.sh"):
        run_native_row(tmp_path / "nope", target, draft, 3, [Prompt("p", "hi")], {"p": "hi"}, settings)
    with pytest.raises(InvalidSetting, match="failed on prompt 'p' .exit 3.: E failed to initialize"):
        run_native_row(
            fake_binary(tmp_path, "E failed to initialize", exit_status=3),
            target,
            draft,
            3,
            [Prompt("p", "hi")],
            {"p": "hi"},
            settings,
        )


def test_a_missing_native_binary_is_refused_before_any_timing(invoke, tiny_store, monkeypatch):
    from ollama_spec.bench import runner

    monkeypatch.setattr(runner, "run_engine_rows", lambda *a, **k: pytest.fail("timed before checking --native"))
    result = invoke(
        "bench",
        "tiny-target",
        "-d",
        "tiny-draft",
        "--models-dir",
        tiny_store,
        "--no-check",
        "--native",
        "/nonexistent/llama-speculative-simple",
    )
    assert result.exit_code == 1
    assert result.output.strip() == (
        "Error: --native /nonexistent/llama-speculative-simple does not exist: "
        "build it with scripts/build-native-speculative.sh"
    )


def test_a_model_with_an_adapter_is_refused_by_native_before_any_timing(invoke, store_copy, tmp_path, monkeypatch):
    from ollama_spec.bench import runner
    from tests.stores import lora_variant

    lora_variant(store_copy, "tiny-lora", tmp_path)
    monkeypatch.setattr(runner, "run_engine_rows", lambda *a, **k: pytest.fail("timed before checking --native"))
    result = invoke(
        "bench",
        "tiny-lora",
        "-d",
        "tiny-draft",
        "--models-dir",
        store_copy,
        "--no-check",
        "--native",
        fake_binary(tmp_path, "decoded 5 tokens in 0.1 seconds"),
    )
    assert result.exit_code == 1 and result.output.strip() == (
        "Error: --native runs models without LoRA adapters: leave it out for a model with an adapter layer"
    )


def test_a_head_runs_as_llama_cpps_eagle3_draft(tmp_path, tiny_models):
    from ollama_spec.models.resolve import resolve_model
    from ollama_spec.synthetic.eagle3_head import write_eagle3_head

    target = tiny_models[0]
    write_eagle3_head(tmp_path / "head.gguf", target.path, "random", target_layers=(0, 2, 3))
    head = resolve_model(str(tmp_path / "head.gguf"))
    settings = BenchSettings(ks=(3,), max_tokens=64, runs=1, n_threads=2)
    run_native_row(fake_binary(tmp_path, REPORT), target, head, 3, [Prompt("p", "hi")], {"p": "hi"}, settings)
    args = (tmp_path / "args").read_text().split()
    assert args[args.index("--spec-type") + 1] == "draft-eagle3" and str(head.path) in args


def test_the_targets_mtp_layers_draft_in_llama_cpps_own_mtp_driver(tmp_path, tiny_models):
    """No draft (bench -d mtp): `--spec-type draft-mtp` over the target's GGUF alone, no -md; a token piece
    that ends inside a character (llama.cpp prints the text a piece at a time) is read, not a crash."""
    target, _ = tiny_models
    binary = fake_binary(tmp_path, REPORT.replace("n_draft ", "\x88\xe2\x82 n_draft "))
    settings = BenchSettings(ks=(3,), max_tokens=64, runs=1, n_threads=2)
    row = run_native_row(binary, target, None, 3, [Prompt("p", "hi")], {"p": "hi"}, settings)
    assert row.tokens_per_second == 32.0 and row.accepted == 47
    args = (tmp_path / "args").read_text().split()
    assert args[args.index("--spec-type") + 1] == "draft-mtp" and "-md" not in args and str(target.path) in args


def test_llama_cpps_mtp_driver_writes_our_text_and_accepts_as_we_do(tiny_models, tmp_path):
    """The real llama-speculative-simple (scripts/build-native-speculative.sh; skipped without it) on a crafted
    MTP target, greedy, at the same K as ours: the same text, and the same drafts accepted but for its first
    step, which drafts from the prompt (ours reads the prompt, then drafts after the first token)."""
    from ollama_spec.decoding.loop import SpeculationSettings
    from ollama_spec.decoding.sampling import SamplingSettings
    from ollama_spec.engine.engine import Engine, Request
    from ollama_spec.models.resolve import resolve_model
    from ollama_spec.synthetic.mtp_target import MtpShape, write_mtp_target
    from tests.conftest import engine_settings
    from tests.pull.test_head_native import native_binary

    binary = native_binary("llama-speculative-simple")
    if binary is None:
        pytest.skip("llama-speculative-simple not built (scripts/build-native-speculative.sh)")
    target = resolve_model(
        str(write_mtp_target(tmp_path / "crafted.gguf", tiny_models[0].path, MtpShape(crafted=True)))
    )
    k, n, prompt = 2, 32, "Once upon a time"
    settings = BenchSettings(ks=(k,), max_tokens=n, runs=1, n_threads=1, n_ctx=512, flash_attention="off")
    log = _report(binary, _command(binary, target, None, k, prompt, settings, n), "once")
    theirs = {name: int(re.search(rf"{name}\s*=\s*(\d+)", log)[1]) for name in ("n_predict", "n_accept")}
    request = Request(prompt, raw=True, max_tokens=theirs["n_predict"], ignore_eos=True,
                      sampling=SamplingSettings(temperature=0), speculation=SpeculationSettings(k))  # fmt: skip
    with Engine(target, None, engine_settings(mtp=True, n_ctx=512)) as engine:
        generation = engine.generate(request)
        text = "".join(generation)
    assert text and text in log  # it prints the prompt, then the text
    assert 0 <= theirs["n_accept"] - generation.result.speculation.accepted <= k
    assert generation.result.speculation.accepted > n // 2
