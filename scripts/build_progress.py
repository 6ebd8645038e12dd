"""Run a long build quietly: its whole output goes to a log, the screen gets one progress line.

    python scripts/build_progress.py --log FILE --label "building llama-cpp-python" -- COMMAND [ARGS...]

On a terminal the line is rewritten in place every second: the stage, the build tool's own counter
(ninja's `[N/M]`, make's `[ NN%]`), what it is compiling and the elapsed time. In a log or CI (not a
terminal) the same line is printed as a plain line when the stage changes and at least every 10 s, so
a reader can tell a slow build from a hung one. On failure: the last lines of the log and its path.
The exit status is COMMAND's. Standard library only: it runs before anything else is installed.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass

PLAIN_EVERY_S = 10.0  # not a terminal: a line at least this often
TTY_EVERY_S = 1.0
TAIL_LINES = 30

NINJA = re.compile(r"^\[(\d+)/(\d+)\]\s+(.*)")
MAKE = re.compile(r"^\[\s*(\d+)%\]\s+(.*)")
# "Building CXX object vendor/llama.cpp/ggml/src/CMakeFiles/ggml-cpu.dir/ggml-cpu/ops.cpp.o"
OBJECT = re.compile(r"Building \w+ object .*?CMakeFiles/([^/]+)\.dir/(?:.*/)?([^/\s]+?)\.o\b")
LINKING = re.compile(r"Linking \w+ (?:shared |static )?(?:library|executable|module) (?:.*/)?(\S+)")
# Lines of pip and scikit-build-core that mark the stages before and after the compile.
STAGES = (
    (re.compile(r"Installing build dependencies"), "installing the build tools"),
    (re.compile(r"Getting requirements to build wheel|Preparing metadata"), "preparing"),
    (re.compile(r"^-- (The C|The CXX|Configuring|Detecting|Looking for|Found)"), "configuring (cmake)"),
    (re.compile(r"Installing project into wheel|^-- Install"), "packing the wheel"),
    (re.compile(r"^(Created wheel|Stored in directory)"), "wheel built"),
    (re.compile(r"^(Collecting|Downloading|Requirement already)"), "fetching"),
    (re.compile(r"^Installing collected packages"), "installing"),
)


@dataclass
class Progress:
    """What the build has said so far, read from its output one line at a time."""

    stage: str = ""  # until the output says which: "configuring (cmake)", "compiling", ...
    counter: str = ""  # "[ 58%] 120/205" as the build tool counts
    what: str = ""  # the file being compiled or the library being linked

    def read(self, line: str) -> None:
        text = line.strip()
        if m := NINJA.match(text):
            done, total = int(m[1]), int(m[2])
            self.stage, self.counter, self.what = "compiling", f"[{100 * done // total:3d}%] {done}/{total}", m[3]
        elif m := MAKE.match(text):
            self.stage, self.counter, self.what = "compiling", f"[{int(m[1]):3d}%]", m[2]
        else:
            for pattern, stage in STAGES:
                if pattern.search(text):
                    self.stage, self.what = stage, ""
                    break
            return
        self.what = short_name(self.what)

    def line(self, label: str, elapsed: float) -> str:
        parts = [self.stage, self.counter if self.stage == "compiling" else "", self.what]
        said = " ".join(p for p in parts if p)
        return f"{label}{': ' + said if said else ''}  ({clock(elapsed)})"


def short_name(description: str) -> str:
    """'ggml-cpu: ops.cpp' for a compile, 'linking libllama.so' for a link, else the text itself.
    Verbose builds print the compiler's whole command line: the source after -c names the file."""
    if m := OBJECT.search(description):
        return f"{m[1]}: {m[2]}"
    if m := LINKING.search(description):
        return f"linking {m[1]}"
    if " -c " in description:
        source = description.rsplit(" -c ", 1)[1].split()[0]
        target = re.search(r"CMakeFiles/([^/]+)\.dir/", description)
        return f"{target[1] + ': ' if target else ''}{os.path.basename(source)}"
    if m := re.search(r" -o (\S+)|cmake_symlink_\w+ (\S+)", description):
        return f"linking {os.path.basename(m[1] or m[2])}"
    return description[:80]


def clock(seconds: float) -> str:
    minutes, secs = divmod(int(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


class Screen:
    """One line rewritten in place on a terminal; plain lines, fewer of them, anywhere else."""

    def __init__(self, stream, tty: bool) -> None:
        self.stream, self.tty = stream, tty
        self.shown, self.shown_at, self.shown_stage = "", float("-inf"), ""

    def update(self, text: str, stage: str, now: float) -> None:
        if self.tty:
            width = shutil.get_terminal_size((100, 20)).columns - 1
            self.stream.write("\r\033[K" + text[:width])
            self.shown = text
        elif stage != self.shown_stage or now - self.shown_at >= PLAIN_EVERY_S:
            self.stream.write(text + "\n")
            self.shown_at, self.shown_stage = now, stage
        self.stream.flush()

    def finish(self, text: str) -> None:
        self.stream.write(("\r\033[K" if self.tty else "") + text + "\n")
        self.stream.flush()


def run(command: list[str], log_path: str, label: str, stream=sys.stderr, tty: bool | None = None) -> int:
    """Run `command` with its output in `log_path` and a progress line on `stream`; its exit status."""
    tty = stream.isatty() if tty is None else tty
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    progress, tail, lock = Progress(), deque(maxlen=TAIL_LINES), threading.Lock()
    screen, start = Screen(stream, tty), time.monotonic()
    with open(log_path, "w", encoding="utf-8", errors="replace") as log:
        try:
            child = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                errors="replace", bufsize=1,
            )  # fmt: skip
        except OSError as error:
            screen.finish(f"{label}: cannot run {command[0]}: {error.strerror}")
            return 127

        def pump() -> None:
            for line in child.stdout:
                log.write(line)
                with lock:
                    progress.read(line)
                    tail.append(line.rstrip("\n"))

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            while True:
                try:
                    child.wait(timeout=TTY_EVERY_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                with lock:
                    text, stage = progress.line(label, time.monotonic() - start), progress.stage
                screen.update(text, stage, time.monotonic())
        except KeyboardInterrupt:
            child.terminate()
            child.wait()
            screen.finish(f"{label}: interrupted; the output so far is in {log_path}")
            return 130
        reader.join()
    elapsed = clock(time.monotonic() - start)
    if child.returncode == 0:
        counted = f", {progress.counter.split('] ')[-1]} steps" if progress.counter else ""
        screen.finish(f"{label}: done in {elapsed}{counted}")
        return 0
    screen.finish(f"{label}: failed (exit status {child.returncode}) after {elapsed}; the last lines of the log:")
    for line in tail:
        stream.write(f"  {line}\n")
    stream.write(f"{label}: the whole log is {log_path}\n")
    stream.flush()
    return child.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log", required=True, help="file that receives the command's whole output")
    parser.add_argument("--label", default="building", help="what the line says is going on")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    return run(command, args.log, args.label)


if __name__ == "__main__":
    sys.exit(main())
