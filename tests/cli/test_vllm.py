"""`ollama-spec vllm`: the printed command, its notes, errors as one line, and --run with fake vLLMs."""

import json
import shlex

import pytest

from tests.fake_vllm import fake_vllm

LLAMA = ("llama3.1:70b", "--draft", "llama3.2:1b")


def test_stdout_is_the_command_alone_and_stderr_the_notes(invoke):
    result = invoke("vllm", *LLAMA, "-k", "4", "--tp", "2")
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.stdout)
    assert argv[:3] == ["vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct"]
    assert json.loads(argv[argv.index("--speculative-config") + 1]) == {
        "method": "draft_model",
        "model": "meta-llama/Llama-3.2-1B-Instruct",
        "num_speculative_tokens": 4,
        "draft_tensor_parallel_size": 2,
    }
    assert result.stdout.count("\n") == 1
    assert "# needs vLLM >= 0.15.0; vLLM serves the OpenAI API at http://127.0.0.1:8000/v1" in result.stderr
    assert (
        "# measure it: ollama-spec bench meta-llama/Llama-3.1-70B-Instruct --url http://127.0.0.1:8000/v1"
        in result.stderr
    )


def test_json_has_the_command_repos_and_version(invoke):
    result = invoke("vllm", "qwen2.5:32b", "-d", "qwen2.5:0.5b", "--port", "9000", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["target"] == {"name": "qwen2.5:32b", "repo": "Qwen/Qwen2.5-32B-Instruct"}
    assert data["draft"]["repo"] == "Qwen/Qwen2.5-0.5B-Instruct"
    assert data["min_vllm_version"] == "0.25.0" and data["speculative_config"]["use_heterogeneous_vocab"] is True
    assert shlex.split(data["command"]) == data["argv"] and data["url"] == "http://127.0.0.1:9000/v1"


def test_a_preset_gives_the_pair_and_its_auto_k_becomes_5(invoke):
    result = invoke("vllm", "-f", "llama3.3-70b", "--vllm-args", "--max-model-len 8192")
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.stdout)
    assert argv[2] == "meta-llama/Llama-3.3-70B-Instruct" and argv[-2:] == ["--max-model-len", "8192"]
    assert json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == 5
    assert "-k auto is ollama-spec's per-step choice, so K is 5" in result.stderr


def test_a_presets_num_ctx_is_max_model_len_and_its_system_is_said_to_be_unused(invoke):
    result = invoke("vllm", "-f", "llama3.1-70b")
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.stdout)
    assert argv[argv.index("--max-model-len") + 1] == "8192"  # the preset's PARAMETER num_ctx
    assert (
        "note: llama3.1-70b.Modelfile: SYSTEM is not a `vllm serve` option; a client sends the system message "
        "with each request"
    ) in result.stderr
    help_text = " ".join(invoke("vllm", "--help").output.split())
    assert (
        "its FROM, DRAFT, num_speculative_tokens (-k) and num_ctx (vLLM's --max-model-len) are the defaults"
        in help_text
    )
    assert "Its SYSTEM and sampling PARAMETERs are not `vllm serve` options" in help_text


def test_odd_pairs_are_a_warning_line_on_stderr(invoke):
    result = invoke("vllm", "llama3.2:1b", "-d", "llama3.2:1b")
    assert result.exit_code == 0, result.output
    assert "warning: the draft is the target itself (meta-llama/Llama-3.2-1B-Instruct)" in result.stderr
    assert "warning" not in result.stdout
    data = json.loads(invoke("vllm", "llama3.1:8b", "-d", "llama3.1:70b", "--json").stdout)
    assert data["warnings"][0].startswith("the draft (70B) is not smaller than the target (8B)")


def test_served_model_name_and_a_bracketed_host_reach_the_printed_hints(invoke):
    result = invoke("vllm", *LLAMA, "--host", "[::1]", "--vllm-args", "--served-model-name llama")
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.stdout)
    assert argv[argv.index("--host") + 1] == "::1"
    assert "# measure it: ollama-spec bench llama --url 'http://[::1]:8000/v1'" in result.stderr


def test_help_says_the_version_and_that_the_old_flags_are_gone(invoke):
    text = " ".join(invoke("vllm", "--help").output.split())
    assert "needs vLLM >= 0.15" in text
    assert "--speculative-model and --num-speculative-tokens flags that tutorials still show are gone" in text
    assert "ollama-spec bench REPO --url http://HOST:PORT/v1" in text


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("mistral:7b", "-d", "llama3.2:1b"), "Error: no Hugging Face repository is known for mistral:7b"),
        (("hf.co/u/r-GGUF:Q4_K_M", "-d", "llama3.2:1b"), "Error: hf.co/u/r-GGUF:Q4_K_M is a GGUF repository"),
        (("llama3.1:70b", "-d", "qwen2.5:0.5b"), "Error: qwen2.5:0.5b (Qwen/Qwen2.5-0.5B-Instruct) cannot draft"),
        (("llama3.1:70b", "-d", "auto"), "Error: --draft auto is ollama-spec's own"),
        (("llama3.1:70b", "-d", "llama3.2:1b", "--tp", "2", "--draft-tp", "1"), "Error: vLLM runs a draft model only"),
        (
            ("llama3.1:70b", "-d", "llama3.2:1b", "--vllm-args", "--speculative-model x"),
            "Error: --speculative-model in",
        ),
        (("llama3.1:70b", "-d", "llama3.2:1b", "--vllm-args", "'unclosed"), "Error: --vllm-args: No closing quotation"),
        (
            ("llama3.1:70b", "-d", "llama3.2:1b", "--vllm-args", "--port 9000"),
            "Error: --port in the extra vLLM arguments: this command writes it itself; give --port instead",
        ),
        (("llama3.1:70b", "-d", "llama3.2:1b", "--vllm-args", "-tp 2"), "give --tp instead"),
        (("llama3.1:70b", "-d", "llama3.2:1b", "--host", "[::1"), "Error: --host '[::1' is not an address"),
        (("llama3.1:70b",), "Error: Missing option '--draft'"),
    ],
)
def test_bad_input_is_one_clear_line(invoke, args, says):
    result = invoke("vllm", *args)
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit)
    assert says in result.output and "Traceback" not in result.output


def test_run_without_vllm_says_how_to_install_it(invoke, no_vllm):
    result = invoke("vllm", *LLAMA, "--run")
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.strip().endswith(
        "Error: vLLM is not installed here: pip install 'vllm>=0.15.0' (best in "
        "its own virtual environment: it pins its own torch), or run the printed "
        "command on the machine that has it"
    )


def test_run_with_an_old_vllm_names_the_version_needed(invoke, no_vllm):
    fake_vllm(no_vllm, "0.13.0")
    result = invoke("vllm", *LLAMA, "--run")
    assert result.exit_code == 1
    assert f"Error: vLLM 0.13.0 ({no_vllm / 'vllm'}) is too old: this command needs vLLM >= 0.15.0" in result.stderr
    assert not (no_vllm / "called").exists()


def test_run_starts_vllm_with_the_printed_command(invoke, no_vllm, monkeypatch):
    """exec is replaced here (it would replace pytest); tests/test_vllm.py runs the real one in a child."""
    fake_vllm(no_vllm, "0.16.0")
    started = []
    monkeypatch.setattr(
        "ollama_spec.cli.vllm.exec_vllm", lambda command, launcher: started.append([*launcher, *command.argv[1:]])
    )
    printed = shlex.split(invoke("vllm", *LLAMA, "-k", "3").stdout)
    result = invoke("vllm", *LLAMA, "-k", "3", "--run")
    assert result.exit_code == 0, result.output
    assert started == [[str(no_vllm / "vllm"), *printed[1:]]]
    assert f"starting: {shlex.join(printed)}" in result.stderr
