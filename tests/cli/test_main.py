"""The command group: commands loaded on first use, what `--help`, `list` and `show` import, missing extras."""

import subprocess
import sys

import click
import pytest

from ollama_spec.cli import cli
from ollama_spec.cli.main import COMMANDS

HEAVY = ("numpy", "llama_cpp", "fastapi", "uvicorn", "jinja2", "matplotlib")


def imported(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """Run `python -X importtime -m ollama_spec ARGS`; return it and the modules it imported (each
    package of a dotted name too: numpy for numpy.linalg)."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "ollama_spec", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    names = [line.rpartition("|")[2].strip() for line in run.stderr.splitlines() if line.startswith("import time:")]
    return run, {".".join(name.split(".")[: i + 1]) for name in names for i in range(name.count(".") + 1)}


def test_each_summary_is_its_commands_first_sentence():
    with click.Context(cli) as ctx:
        for name, (_, _, summary) in COMMANDS.items():
            command = cli.get_command(ctx, name)
            assert command.name == name and command.get_short_help_str(limit=1000) == summary


def test_help_lists_every_command(invoke):
    listed = invoke("--help").output.partition("Commands:\n")[2].splitlines()
    assert [line.split()[0] for line in listed] == sorted(COMMANDS)
    assert invoke("nosuch").exit_code == 2


def test_help_imports_no_command():
    run, modules = imported("--help")
    assert run.returncode == 0 and "Commands:" in run.stdout
    assert not modules & set(HEAVY)
    assert {m for m in modules if m.startswith("ollama_spec.cli.")} == {"ollama_spec.cli.main"}


@pytest.mark.parametrize("command", ["list", "show"])
def test_list_and_show_import_no_server_plot_or_template_engine(command, tiny_store):
    run, modules = imported(command, *(["tiny-target"] if command == "show" else []), "--models-dir", tiny_store)
    assert run.returncode == 0, run.stderr[-2000:]
    assert not modules & {"fastapi", "uvicorn", "matplotlib"}


def test_list_imports_no_numpy(tiny_store):
    run, modules = imported("list", "--models-dir", tiny_store)
    assert run.returncode == 0 and not modules & set(HEAVY)


def test_show_imports_no_numpy_or_llama_cpp(tiny_store):
    run, modules = imported("show", "tiny-target", "--models-dir", tiny_store)
    assert run.returncode == 0 and not modules & set(HEAVY)


def without(module: str, *args: str) -> subprocess.CompletedProcess:
    """The CLI run with `module` unimportable, as where its optional extra is not installed."""
    code = (
        f"import sys; sys.modules[{module!r}] = None; sys.argv[0] = 'ollama-spec'; "
        "from ollama_spec.cli import main; main()"
    )
    return subprocess.run(
        [sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )


@pytest.mark.parametrize("module", ["fastapi", "uvicorn", "prometheus_client"])
def test_serve_without_the_server_extra_says_what_to_install(module, tiny_store):
    run = without(module, "serve", "tiny-target", "--models-dir", tiny_store)
    assert (run.returncode, run.stderr) == (
        1,
        "Error: ollama-spec serve needs the server extra: pip install 'ollama-spec[server]'\n",
    )


def test_bench_out_without_the_bench_extra_says_so_before_timing(tiny_store, tmp_path):
    run = without(
        "matplotlib", "bench", "tiny-target", "-d", "tiny-draft", "--out", tmp_path / "out", "--models-dir", tiny_store
    )
    assert (run.returncode, run.stderr) == (
        1,
        "Error: ollama-spec bench needs the bench extra: pip install 'ollama-spec[bench]'\n",
    )


def test_commands_without_an_extra_still_run(tiny_store):
    run = without("fastapi", "list", "--models-dir", tiny_store)
    assert run.returncode == 0 and "tiny-target" in run.stdout


def test_a_missing_module_of_no_extra_is_not_blamed_on_one(invoke, monkeypatch):
    def broken(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'gguf'", name="gguf")

    monkeypatch.setattr("ollama_spec.cli.inspect.open_store", broken)
    result = invoke("list")
    assert result.exit_code == 1 and isinstance(result.exception, ModuleNotFoundError)


def test_rpc_server_takes_threads_but_not_t(invoke):
    assert "--threads" in invoke("rpc-server", "--help").output
    result = invoke("rpc-server", "-t", "2")
    assert result.exit_code == 2 and "No such option '-t'" in result.output


def test_the_server_and_plot_libraries_are_extras_and_the_suite_installs_both():
    from pathlib import Path

    import tomllib

    project = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    names = {requirement.split(">")[0].split("<")[0].split("=")[0] for requirement in project["dependencies"]}
    assert not names & {"fastapi", "uvicorn", "prometheus-client", "matplotlib"}
    extras = project["optional-dependencies"]
    assert [r.split(">")[0] for r in extras["server"]] == ["fastapi", "uvicorn", "pydantic", "prometheus-client"]
    assert extras["bench"][0].startswith("matplotlib") and extras["test"][0] == "ollama-spec[server,bench]"
