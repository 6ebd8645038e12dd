"""A command's options handed over as one frozen value (cli/flags.py)."""

from dataclasses import FrozenInstanceError, dataclass, fields

import click
import pytest
from click.testing import CliRunner

from ollama_spec.cli.flags import into


@dataclass(frozen=True)
class Flags:
    name: str
    count: int
    loud: bool


def command(flags_type=Flags):
    seen = []

    @click.command()
    @click.argument("name")
    @click.option("--count", type=int, default=2)
    @click.option("--loud", is_flag=True)
    @click.pass_context
    @into(flags_type)
    def run(context: click.Context, flags) -> None:
        seen.append((context.info_name, flags))

    return run, seen


def test_the_options_arrive_as_one_frozen_value():
    run, seen = command()
    result = CliRunner().invoke(run, ["box", "--count", "5"], prog_name="run")
    assert result.exit_code == 0, result.output
    ((name, flags),) = seen
    assert name == "run" and flags == Flags("box", 5, False)
    with pytest.raises(FrozenInstanceError):
        flags.count = 6


def test_an_option_without_its_field_fails_on_the_first_run():
    @dataclass(frozen=True)
    class Short:
        name: str
        count: int

    run, _ = command(Short)
    result = CliRunner().invoke(run, ["box"])
    assert isinstance(result.exception, TypeError)
    assert str(result.exception) == "run's options and Short differ: ['loud']"


@pytest.mark.parametrize("module", ["generate", "chat", "serve", "bench"])
def test_each_command_names_every_option_it_declares(module):
    import importlib

    cmd = getattr(importlib.import_module(f"ollama_spec.cli.{module}"), module)
    declared = {param.name for param in cmd.params}
    assert declared == {field.name for field in fields(cmd.callback.flags_type)}
