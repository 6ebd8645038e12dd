"""Progress shown three ways, and where pulled models go."""

from __future__ import annotations

import io
import json

from ollama_spec.pull.progress import BarReporter, JsonReporter, LineReporter, PullEvent, make_reporter
from ollama_spec.pull.writer import writable_store_root

DIGEST = "sha256:" + "cd" * 32


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def events():
    yield PullEvent("m:latest", "pulling manifest")
    for done in (0, 512, 1024):
        yield PullEvent("m:latest", "pulling cdcdcdcdcdcd", DIGEST, 1024, done)
    yield PullEvent("m:latest", "success")


def test_reporter_follows_the_terminal_and_json_flag():
    assert isinstance(make_reporter(True, Terminal(), Terminal()), JsonReporter)
    assert isinstance(make_reporter(False, io.StringIO(), Terminal()), BarReporter)  # bars are drawn on stderr
    assert isinstance(make_reporter(False, io.StringIO(), io.StringIO()), LineReporter)
    # stderr into a log: lines, never carriage returns and escape codes, even when stdout is a terminal
    assert isinstance(make_reporter(False, Terminal(), io.StringIO()), LineReporter)


class ClosedPipe(io.StringIO):
    def write(self, text):
        raise BrokenPipeError()


class FullDisk(io.StringIO):
    def write(self, text):
        raise OSError(28, "No space left on device")


def test_a_closed_pipe_silences_progress_without_stopping_the_pull():
    for reporter in (LineReporter(ClosedPipe()), JsonReporter(ClosedPipe()), LineReporter(FullDisk())):
        for event in events():
            reporter(event)  # no BrokenPipeError: the pull itself goes on
        assert reporter.stream.gone


def test_json_lines_keep_first_and_last_progress():
    out = io.StringIO()
    reporter = JsonReporter(out)
    for event in events():
        reporter(event)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert rows[0] == {"model": "m:latest", "status": "pulling manifest"}
    assert rows[-2]["completed"] == 1024 and rows[-1]["status"] == "success"
    assert 0 in [r.get("completed") for r in rows]


def test_lines_say_each_status_once():
    out = io.StringIO()
    reporter = LineReporter(out)
    for event in events():
        reporter(event)
    assert out.getvalue().splitlines() == [
        "m:latest: pulling manifest",
        "m:latest: pulling cdcdcdcdcdcd (1.0 KiB)",
        "m:latest: success",
    ]


def test_bar_per_layer_with_bytes():
    out = Terminal()
    reporter = BarReporter(out)
    for event in events():
        reporter(event)
    reporter.close()
    text = out.getvalue()
    assert "m:latest: pulling manifest" in text and "cdcdcdcdcdcd" in text and "1.00k/1.00k" in text


def test_missing_home_store_is_created(isolated_user_paths):
    root = writable_store_root(None, environ={})
    assert root.path == isolated_user_paths / ".ollama" / "models" and root.path.is_dir()
    assert root.source == "~/.ollama/models"


def test_ollama_models_wins(tmp_path):
    root = writable_store_root(None, environ={"OLLAMA_MODELS": str(tmp_path / "mine")})
    assert root.path == tmp_path / "mine" and root.source == "OLLAMA_MODELS"
