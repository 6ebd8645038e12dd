"""Notes on stderr while something takes a moment (issue 42): a step's progress in place on a terminal,
plain and thinned-out lines in a log, a waiting step's elapsed time, and nothing on stdout. What
`generate` says while it loads and times: test_generate_loading.py."""

import io
import time

from ollama_spec.cli import common
from ollama_spec.cli.common import Notes


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_on_a_terminal_a_steps_progress_rewrites_its_line():
    screen = Terminal()
    notes = Notes(stream=screen)
    notes("timing steps: 1 of 3")
    notes("timing steps: 2 of 3")
    notes("something else")
    assert screen.getvalue() == (
        "note: timing steps: 1 of 3\n\033[1F\033[Jnote: timing steps: 2 of 3\nnote: something else\n"
    )


def test_a_progress_line_that_wrapped_is_cleared_whole(monkeypatch):
    import os

    monkeypatch.setattr(common.shutil, "get_terminal_size", lambda fallback: os.terminal_size((20, 5)))
    screen = Terminal()
    notes = Notes(prefix="", stream=screen)
    notes("writing a-long-model-name: layer 1 of 9")  # 39 characters: two rows of 20
    notes("writing a-long-model-name: layer 2 of 9")
    assert "\033[2F\033[Jwriting a-long-model-name: layer 2 of 9\n" in screen.getvalue()


def test_in_a_log_progress_is_plain_lines_at_most_one_every_few_seconds(monkeypatch):
    log = io.StringIO()
    notes = Notes(prefix="", stream=log)
    notes("writing x: layer 1 of 3")
    notes("writing x: layer 2 of 3")  # too soon after the last: left out
    monkeypatch.setattr(common, "PLAIN_EVERY_S", 0.0)
    notes("writing x: layer 3 of 3")
    notes("writing y: 3 layers")
    assert log.getvalue() == "writing x: layer 1 of 3\nwriting x: layer 3 of 3\nwriting y: 3 layers\n"


def test_a_step_the_cli_waits_on_says_how_long_it_has_taken_only_when_it_is_slow():
    log = io.StringIO()
    notes = Notes(stream=log)
    with notes.ticking("loading m", every=0.5):
        pass
    assert log.getvalue() == ""
    with notes.ticking("loading m", every=0.02):
        time.sleep(0.15)
    lines = log.getvalue().splitlines()
    assert lines[0] == "note: loading m: 0 s so far" and lines[-1] == "note: loading m took 0 s"


def test_demo_store_reports_each_layer_on_stderr_and_only_the_result_on_stdout(invoke, tmp_path, monkeypatch):
    monkeypatch.setattr(common, "PLAIN_EVERY_S", 0.0)
    result = invoke("demo-store", tmp_path / "demo", "--tiny-only")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"demo store ready at {tmp_path / 'demo'}: ") and result.stdout.count("\n") == 1
    assert "generating tiny-target's weights: layer 4 of 4" in result.stderr.splitlines()
    assert "writing tiny-target: layer 4 of 4, F32" in result.stderr.splitlines()
    assert "\033" not in result.stderr  # not a terminal: plain lines
