"""--draft is declared once (`options.draft_option`): every command that takes a draft names it, parses it
and describes its values alike, and its help says only the values the command accepts."""

import click
import pytest

from ollama_spec.cli import cli
from ollama_spec.cli.main import COMMANDS
from ollama_spec.cli.options import DraftOption
from ollama_spec.decoding.proposer_table import AUTO, NGRAM

SHARED_HEAD = "Draft model (small, same vocabulary as the target"


def draft_params() -> dict[str, click.Parameter]:
    """Each command's option named draft, by command name (`pair TARGET DRAFT` takes an argument)."""
    found = {}
    with click.Context(cli) as ctx:
        for name in COMMANDS:
            params = [p for p in cli.get_command(ctx, name).params if isinstance(p, click.Option) and p.name == "draft"]
            if params:
                found[name] = params[0]
    return found


def test_every_command_taking_a_draft_uses_the_shared_declaration():
    params = draft_params()
    assert {"generate", "chat", "serve", "check", "bench", "vllm"} <= set(params)
    for name, param in params.items():
        assert isinstance(param, DraftOption), f"{name} declares its own --draft"
        assert (param.opts, param.secondary_opts, param.envvar) == (["--draft", "-d"], [], None), name
        assert param.help.startswith(SHARED_HEAD), name


@pytest.mark.parametrize(
    "command, args, says",
    [
        ("bench", ("tiny-target",), "bench needs a draft model"),
        ("vllm", ("llama3.1:70b",), f"--draft {NGRAM} is ollama-spec's own"),
    ],
)
def test_a_command_whose_help_leaves_out_ngram_refuses_it_in_one_line(invoke, tiny_store, command, args, says):
    assert f"'{NGRAM}'" not in draft_params()[command].help
    extra = ("--models-dir", tiny_store) if command == "bench" else ()
    result = invoke(command, *args, "--draft", NGRAM, *extra)
    assert result.exit_code != 0 and isinstance(result.exception, SystemExit)
    assert says in result.output and "Traceback" not in result.output


def test_help_names_auto_and_ngram_where_the_command_takes_them():
    params = draft_params()
    for name in ("generate", "chat", "serve", "check"):
        assert f"'{AUTO}'" in params[name].help and f"'{NGRAM}'" in params[name].help, name
    assert f"'{AUTO}'" in params["bench"].help and f"'{AUTO}'" not in params["vllm"].help
    assert params["vllm"].required and not params["generate"].required
