"""scripts/build_progress.py: a long build as one progress line, on a canned llama-cpp-python build log."""

import importlib.util
import io
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "build_progress.py"
_spec = importlib.util.spec_from_file_location("build_progress", SCRIPT)
build_progress = sys.modules["build_progress"] = importlib.util.module_from_spec(_spec)  # a script, not a package
_spec.loader.exec_module(build_progress)

# Lines of `pip wheel -v` building llama-cpp-python 0.3.36 (cmake.verbose: ninja prints each command),
# paths shortened.
CANNED = """\
Processing /tmp/sdist/llama_cpp_python-0.3.36.tar.gz
  Installing build dependencies: started
  WARNING: Location 'file:///opt/pypi-more/simple/scikit-build-core/' is ignored: it is neither a file nor a directory.
  Collecting scikit-build-core[pyproject]>=0.9.2
  Installing build dependencies: finished with status 'done'
  Preparing metadata (pyproject.toml): started
  *** Configuring CMake...
  -- The C compiler identification is GNU 12.2.0
  -- Adding CPU backend variant ggml-cpu: -march=native
  *** Building project with Ninja...
  [1/87] /usr/bin/g++ -DGGML_BUILD -O3 -MD -MT vendor/llama.cpp/ggml/src/CMakeFiles/ggml-base.dir/ggml.cpp.o \
-o vendor/llama.cpp/ggml/src/CMakeFiles/ggml-base.dir/ggml.cpp.o -c /tmp/b/vendor/llama.cpp/ggml/src/ggml.cpp
  [16/87] /usr/bin/cmake -E cmake_symlink_library bin/libggml-base.so.0.25.3  bin/libggml-base.so.0 bin/libggml-base.so
  [29/87] /usr/bin/g++ -O3 -o vendor/llama.cpp/ggml/src/CMakeFiles/ggml-cpu.dir/ggml-cpu/repack.cpp.o \
-c /tmp/b/vendor/llama.cpp/ggml/src/ggml-cpu/repack.cpp
  [87/87] /usr/bin/g++ -fPIC -O3 -shared -Wl,-soname,libllama.so.0 -o bin/libllama.so.0.0.1 a.o b.o
  *** Installing project into wheel...
  -- Installing: /tmp/w/platlib/llama_cpp/lib/libllama.so
  Created wheel for llama_cpp_python: filename=llama_cpp_python-0.3.36-py3-none-linux_x86_64.whl
"""


def read_all(text: str) -> list[str]:
    progress, seen = build_progress.Progress(), []
    for line in text.splitlines():
        progress.read(line)
        seen.append(progress.line("building", 75))
    return seen


def test_the_line_says_the_stage_the_build_tools_counter_what_compiles_and_the_time():
    seen = read_all(CANNED)
    assert "building: installing the build tools  (1m15s)" in seen
    assert "building: configuring (cmake)  (1m15s)" in seen
    assert "building: compiling [  1%] 1/87 ggml-base: ggml.cpp  (1m15s)" in seen
    assert "building: compiling [ 18%] 16/87 linking libggml-base.so.0.25.3  (1m15s)" in seen
    assert "building: compiling [ 33%] 29/87 ggml-cpu: repack.cpp  (1m15s)" in seen
    assert "building: compiling [100%] 87/87 linking libllama.so.0.0.1  (1m15s)" in seen
    assert seen[-1] == "building: wheel built  (1m15s)"
    assert not any("Location" in line for line in seen)  # pip's warnings stay in the log


def test_before_the_output_says_anything_the_line_is_the_label_and_the_time():
    assert build_progress.Progress().line("creating .venv", 11) == "creating .venv  (11s)"


def test_makes_percentages_and_ninja_descriptions_read_as_well():
    assert read_all("[ 58%] Building CXX object src/CMakeFiles/llama.dir/llama-model.cpp.o")[-1] == (
        "building: compiling [ 58%] llama: llama-model.cpp  (1m15s)"
    )
    assert read_all("[3/9] Linking CXX shared library bin/libggml.so")[-1] == (
        "building: compiling [ 33%] 3/9 linking libggml.so  (1m15s)"
    )


def slow_build(tmp_path: Path, *, status: int = 0, pause: float = 0.0) -> list[str]:
    """A command that prints the canned log, pausing `pause` s after the first compile, then exits `status`."""
    canned = tmp_path / "canned.log"
    canned.write_text(CANNED)
    code = (
        "import sys, time\n"
        f"for line in open({str(canned)!r}):\n"
        "    print(line, end='', flush=True)\n"
        f"    if line.lstrip().startswith('[1/87]'): time.sleep({pause})\n"
        f"sys.exit({status})\n"
    )
    return [sys.executable, "-c", code]


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setattr(build_progress, "TTY_EVERY_S", 0.05)
    monkeypatch.setattr(build_progress, "PLAIN_EVERY_S", 0.3)


def test_not_a_terminal_plain_lines_keep_coming_while_the_build_is_silent(tmp_path, quick):
    out, log = io.StringIO(), tmp_path / "logs" / "build.log"
    status = build_progress.run(slow_build(tmp_path, pause=1.5), str(log), "building", stream=out, tty=False)
    lines = out.getvalue().splitlines()
    assert status == 0 and "\r" not in out.getvalue()
    waiting = [line for line in lines if "1/87 ggml-base: ggml.cpp" in line]
    assert len(waiting) >= 3  # the same step, printed again with its time, during the 1.5 s pause
    assert lines[-1].startswith("building: done in ") and lines[-1].endswith(", 87/87 steps")
    assert log.read_text() == CANNED  # the whole output, warnings included, is in the log
    assert not any("Location" in line for line in lines)


def test_on_a_terminal_one_line_is_rewritten_in_place(tmp_path, quick):
    out = io.StringIO()
    status = build_progress.run(
        slow_build(tmp_path, pause=0.5), str(tmp_path / "b.log"), "building", stream=out, tty=True
    )
    text = out.getvalue()
    assert status == 0 and text.count("\n") == 1 and text.endswith(" steps\n")
    assert text.count("\r\033[K") >= 3


def test_a_failed_build_shows_the_logs_last_lines_and_where_the_whole_log_is(tmp_path, quick):
    log = tmp_path / "build.log"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--log", str(log), "--label", "building", "--", *slow_build(tmp_path, status=3)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 3 and result.stdout == ""
    assert "building: failed (exit status 3) after " in result.stderr
    assert "  Created wheel for llama_cpp_python" in result.stderr  # the log's last line
    assert result.stderr.endswith(f"building: the whole log is {log}\n")


def test_a_command_that_cannot_run_is_one_line_and_a_status(tmp_path):
    out = io.StringIO()
    status = build_progress.run(["/nonexistent/pip"], str(tmp_path / "b.log"), "building", stream=out, tty=False)
    assert status == 127 and out.getvalue() == "building: cannot run /nonexistent/pip: No such file or directory\n"
