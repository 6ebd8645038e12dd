"""The `vllm serve` command (vllm.build_command) and finding a new enough vLLM (fake `vllm` programs)."""

import json
import os
import re
import shlex
import subprocess
import sys

import pytest

from ollama_spec.errors import IncompatibleDraft, InvalidSetting, VllmUnavailable
from ollama_spec.integrations.vllm import (
    DRAFT_MODEL_VERSION,
    HETEROGENEOUS_VOCAB_VERSION,
    VllmSettings,
    build_command,
    find_vllm,
    installed_version,
    parse_version,
    ready_launcher,
)
from ollama_spec.integrations.vllm_repos import to_hf
from tests.fake_vllm import fake_vllm


def command(target="llama3.1:70b", draft="llama3.2:1b", **settings):
    return build_command(to_hf(target), to_hf(draft), VllmSettings(**settings))


def test_the_command_is_vllm_serve_with_a_draft_model_speculative_config():
    cmd = command(k=4, tp=2, port=8123)
    assert cmd.argv[:10] == (
        "vllm",
        "serve",
        "meta-llama/Llama-3.1-70B-Instruct",
        "--tensor-parallel-size",
        "2",
        "--host",
        "127.0.0.1",
        "--port",
        "8123",
        "--speculative-config",
    )
    assert (
        json.loads(cmd.argv[10])
        == cmd.speculative_config
        == {
            "method": "draft_model",
            "model": "meta-llama/Llama-3.2-1B-Instruct",
            "num_speculative_tokens": 4,
            "draft_tensor_parallel_size": 2,
        }
    )
    assert len(cmd.argv) == 11 and cmd.min_version == DRAFT_MODEL_VERSION == (0, 15, 0)
    assert shlex.split(cmd.shell) == list(cmd.argv)
    assert cmd.shell.endswith("""--speculative-config '{"method": "draft_model", "model": \
"meta-llama/Llama-3.2-1B-Instruct", "num_speculative_tokens": 4, "draft_tensor_parallel_size": 2}'""")


def test_the_old_flags_are_never_written():
    shell = command().shell
    assert "--speculative-model" not in shell and "--num-speculative-tokens" not in shell
    assert "--speculative_model" not in shell


def test_defaults_are_k5_one_gpu_loopback_port_8000():
    cmd = command()
    assert cmd.speculative_config["num_speculative_tokens"] == 5
    assert cmd.speculative_config["draft_tensor_parallel_size"] == 1
    assert cmd.url == "http://127.0.0.1:8000/v1"
    assert cmd.bench == "ollama-spec bench meta-llama/Llama-3.1-70B-Instruct --url http://127.0.0.1:8000/v1"


@pytest.mark.parametrize(
    ("host", "url"),
    [("0.0.0.0", "http://127.0.0.1:9000/v1"), ("10.0.0.5", "http://10.0.0.5:9000/v1"), ("::1", "http://[::1]:9000/v1")],
)
def test_the_url_is_where_a_client_reaches_the_server(host, url):
    cmd = command(host=host, port=9000)
    assert cmd.url == url and cmd.argv[cmd.argv.index("--host") + 1] == host


def test_extra_vllm_arguments_come_last():
    cmd = command(extra_args=("--max-model-len", "8192", "--gpu-memory-utilization", "0.85"))
    assert cmd.argv[-4:] == ("--max-model-len", "8192", "--gpu-memory-utilization", "0.85")


@pytest.mark.parametrize("arg", ["--speculative-model", "--num_speculative_tokens=5", "--speculative-config"])
def test_extra_arguments_may_not_set_the_speculation_again(arg):
    with pytest.raises(InvalidSetting, match="this command writes --speculative-config itself"):
        command(extra_args=(arg, "x"))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ("--port", "9000"),
            (
                "--port in the extra vLLM arguments: this command writes it itself; give --port instead "
                "(the printed URL and bench command follow it)"
            ),
        ),
        (("--host=0.0.0.0",), "--host in the extra vLLM arguments: this command writes it itself; give --host"),
        (
            ("-tp", "2"),
            (
                "-tp in the extra vLLM arguments: this command writes it itself; give --tp instead (the "
                "draft's draft_tensor_parallel_size must equal it)"
            ),
        ),
        (("--tensor_parallel_size=2",), "--tensor_parallel_size in the extra vLLM arguments"),
    ],
)
def test_extra_arguments_may_not_contradict_the_flags_the_command_writes(args, says):
    with pytest.raises(InvalidSetting, match=re.escape(says)):
        command(extra_args=args)


@pytest.mark.parametrize("args", [("--served-model-name", "llama", "other"), ("--served_model_name=llama",)])
def test_the_bench_command_sends_the_served_model_name(args):
    cmd = command(extra_args=("--max-model-len", "8192", *args))
    assert cmd.served_name == "llama"
    assert cmd.bench == "ollama-spec bench llama --url http://127.0.0.1:8000/v1"


@pytest.mark.parametrize(
    ("host", "bound", "url"), [("[::1]", "::1", "http://[::1]:9000/v1"), ("[::]", "::", "http://127.0.0.1:9000/v1")]
)
def test_a_bracketed_ipv6_host_is_bound_bare_and_bracketed_once_in_the_url(host, bound, url):
    cmd = command(host=host, port=9000)
    assert cmd.argv[cmd.argv.index("--host") + 1] == bound and cmd.url == url


@pytest.mark.parametrize("host", ["[::1", "::1]", "[[::1]]"])
def test_a_half_bracketed_host_is_refused(host):
    with pytest.raises(InvalidSetting, match="is not an address"):
        command(host=host)


def test_a_presets_context_is_vllms_max_model_len_unless_the_extra_arguments_give_one():
    cmd = command(max_model_len=8192)
    at = cmd.argv.index("--max-model-len")
    assert cmd.argv[at : at + 2] == ("--max-model-len", "8192")
    given = command(max_model_len=8192, extra_args=("--max_model_len", "4096")).argv
    assert given.count("--max-model-len") == 0 and given[-2:] == ("--max_model_len", "4096")
    assert "--max-model-len" not in command().argv


def test_odd_pairs_and_a_large_k_are_warned_about_not_refused():
    assert command().warnings == ()
    assert command("llama3.2:1b", "llama3.2:1b").warnings == (
        (
            "the draft is the target itself (meta-llama/Llama-3.2-1B-Instruct): every draft is accepted, but each "
            "step runs the full model K more times, so it is slower than the target alone"
        ),
    )
    assert command("llama3.1:8b", "llama3.1:70b").warnings == (
        (
            "the draft (70B) is not smaller than the target (8B): speculation only pays with a much smaller draft; "
            "swap TARGET and --draft?"
        ),
    )
    assert command(k=16).warnings == ()
    assert command(k=100).warnings[0].startswith("-k 100: vLLM drafts all 100 tokens every step")


def test_a_draft_tp_other_than_the_targets_is_refused_as_vllm_would():
    assert command(tp=2, draft_tp=2).speculative_config["draft_tensor_parallel_size"] == 2
    with pytest.raises(InvalidSetting, match="--draft-tp 1 with --tp 2 is refused"):
        command(tp=2, draft_tp=1)


@pytest.mark.parametrize(("settings", "says"), [({"k": 0}, "-k must be at least 1"), ({"tp": 0}, "--tp must be")])
def test_bad_numbers_are_refused(settings, says):
    with pytest.raises(InvalidSetting, match=says):
        command(**settings)


def test_differently_padded_vocabularies_use_vllms_heterogeneous_vocab_and_need_a_newer_vllm():
    cmd = command("qwen2.5:32b", "qwen2.5:0.5b")
    assert cmd.speculative_config["use_heterogeneous_vocab"] is True
    assert cmd.min_version == HETEROGENEOUS_VOCAB_VERSION == (0, 25, 0)
    assert any("152,064 vs 151,936" in note for note in cmd.notes)
    same = command("qwen2.5-coder:32b", "qwen2.5-coder:7b")
    assert "use_heterogeneous_vocab" not in same.speculative_config and same.min_version == DRAFT_MODEL_VERSION


def test_a_draft_of_another_family_is_refused_before_vllm_downloads_anything():
    with pytest.raises(IncompatibleDraft):
        command("qwen2.5:32b", "llama3.2:1b")


def test_notes_say_what_a_user_must_know():
    notes = command("llama3.1:70b-instruct-q4_K_M", "llama3.2:1b", tp=2).notes
    assert notes[0] == (
        "q4_K_M is Ollama's quantization of meta-llama/Llama-3.1-70B-Instruct: vLLM loads the original weights"
    )
    assert "meta-llama repositories are gated: accept the license on huggingface.co and set HF_TOKEN" in notes
    # (70 + 1) B parameters x 2 bytes = 132 GiB, over 2 GPUs 66 GiB each
    assert any(n.startswith("BF16 weights: about 132 GiB for the pair, 66 GiB on each of 2 GPUs") for n in notes)
    unknown = command("org/model", "llama3.2:1b").notes
    assert "vLLM checks that the two vocabularies match when it loads them" in unknown
    assert not any(n.startswith("BF16") for n in unknown)


# --- the installed vLLM ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "version"),
    [("0.15.0", (0, 15, 0)), ("0.15.1.dev3+gabc", (0, 15, 1)), ("vllm 0.25", (0, 25, 0)), ("0.16.0rc1", (0, 16, 0))],
)
def test_versions_are_read_as_numbers(text, version):
    assert parse_version(text) == version


def test_vllm_on_path_is_found_and_its_version_read(no_vllm):
    program = fake_vllm(no_vllm, "0.15.1")
    assert find_vllm() == [str(program)]
    assert installed_version([str(program)]) == (0, 15, 1)
    assert ready_launcher(DRAFT_MODEL_VERSION) == [str(program)]


def test_vllm_beside_this_python_is_found_without_path(no_vllm, monkeypatch, tmp_path):
    program = fake_vllm(tmp_path / "venv" / "bin")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "venv" / "bin" / "python"))
    assert find_vllm() == [str(program)]


def test_an_importable_vllm_runs_as_a_module(no_vllm, monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: object() if name == "vllm" else None)
    assert find_vllm() == [sys.executable, "-m", "vllm.entrypoints.cli.main"]


def test_no_vllm_is_a_clear_error_with_the_pip_command(no_vllm):
    assert find_vllm() is None
    with pytest.raises(VllmUnavailable, match=r"vLLM is not installed here: pip install 'vllm>=0.15.0'"):
        ready_launcher(DRAFT_MODEL_VERSION)


@pytest.mark.parametrize("old", ["0.10.0", "0.14.1"])
def test_a_vllm_without_draft_models_is_refused_with_the_version_needed(no_vllm, old):
    fake_vllm(no_vllm, old)
    with pytest.raises(
        VllmUnavailable,
        match=rf"vLLM {old} \(.*/vllm\) is too old: this command needs vLLM >= "
        r"0.15.0 \(0.10 to 0.14 refuse draft models\)",
    ):
        ready_launcher(DRAFT_MODEL_VERSION)


def test_the_heterogeneous_vocab_command_needs_0_25(no_vllm):
    fake_vllm(no_vllm, "0.24.0")
    ready_launcher(DRAFT_MODEL_VERSION)
    with pytest.raises(VllmUnavailable, match="needs vLLM >= 0.25.0"):
        ready_launcher(HETEROGENEOUS_VOCAB_VERSION)


def test_a_vllm_that_cannot_say_its_version_is_a_clear_error(no_vllm):
    fake_vllm(no_vllm, "not a version", status=1)
    with pytest.raises(VllmUnavailable, match=r"`.*/vllm --version` failed"):
        ready_launcher(DRAFT_MODEL_VERSION)


def test_exec_replaces_the_process_with_vllm_serve(tmp_path):
    """In a child process: exec must hand vLLM exactly the printed command's arguments."""
    folder = tmp_path / "bin"
    fake_vllm(folder)
    env = {**os.environ, "PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}
    code = (
        "from ollama_spec.integrations.vllm import *; from ollama_spec.integrations.vllm_repos import to_hf; "
        "c = build_command(to_hf('llama3.3:70b'), to_hf('llama3.2:1b'), VllmSettings(k=3)); "
        "exec_vllm(c, ready_launcher(c.min_version))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    expected = command("llama3.3:70b", k=3).argv[1:]
    assert (folder / "called").read_text().splitlines() == list(expected)
