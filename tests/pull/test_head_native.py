"""A converted head drafts in llama.cpp's own EAGLE-3 driver (`--spec-type draft-eagle3`), built from the vendored tree.

The binaries come from scripts/build-native-speculative.sh: beside $LLAMA_SERVER when it is set, else in
build/native/bin; without them these tests are skipped (nothing in ollama-spec needs them).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from ollama_spec.models.resolve import resolve_model
from tests.builders.heads import converted_head

RUN_TIMEOUT_S = 120


def native_binary(name: str) -> Path | None:
    folders = [Path(os.environ["LLAMA_SERVER"]).parent] if os.environ.get("LLAMA_SERVER") else []
    found = [folder / name for folder in [*folders, Path("build/native/bin")] if (folder / name).is_file()]
    return found[0] if found else None


def native_env(binary: Path) -> dict[str, str]:
    return os.environ | {"LD_LIBRARY_PATH": f"{binary.parent}:{os.environ.get('LD_LIBRARY_PATH', '')}"}


@pytest.mark.parametrize("layout", ["eagle", "speculators"])
def test_llama_cpps_own_driver_drafts_with_a_converted_head(tiny_store, tmp_path, layout):
    binary = native_binary("llama-speculative-simple")
    if binary is None:
        pytest.skip("llama-speculative-simple not built (scripts/build-native-speculative.sh)")
    head = converted_head(tiny_store, tmp_path / "head.gguf", layout=layout, draft_vocab=200)
    target = resolve_model("tiny-target", str(tiny_store)).path
    args = ["-m", target, "-md", head, "--spec-type", "draft-eagle3", "--spec-draft-n-max", "4"]
    args += ["-p", "Hello there", "-n", "24", "-t", "1", "--temp", "0"]
    # llama.cpp's logger thread now and then loses the report at exit (the run itself is fine): a few tries
    for _ in range(3):
        done = subprocess.run(
            [str(binary), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env=native_env(binary),
        )
        assert done.returncode == 0, done.stderr[-2000:]
        report = re.search(r"n_drafted\s*=\s*(\d+)", done.stderr + done.stdout)
        if report:
            break
    drafted = int(report.group(1))
    assert drafted > 0  # the head ran: a random head's drafts are simply not accepted


def test_llama_server_serves_with_a_converted_head(tiny_store, tmp_path):
    binary = native_binary("llama-server")
    if binary is None:
        pytest.skip("llama-server not built (scripts/build-native-speculative.sh)")
    head = converted_head(tiny_store, tmp_path / "head.gguf", layout="speculators")
    target = resolve_model("tiny-target", str(tiny_store)).path
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = ["-m", target, "-md", head, "--spec-type", "draft-eagle3", "--spec-draft-n-max", "4"]
    args += ["--host", "127.0.0.1", "--port", port, "-t", "1", "-c", "1024", "-np", "1"]
    with open(tmp_path / "server.log", "w") as log:
        server = subprocess.Popen(
            [str(binary), *map(str, args)], stdout=log, stderr=subprocess.STDOUT, env=native_env(binary)
        )
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + RUN_TIMEOUT_S
            while True:
                assert server.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
                assert time.monotonic() < deadline, "llama-server did not become ready"
                try:
                    with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                        if response.status == 200:
                            break
                except OSError:
                    time.sleep(0.2)
            body = json.dumps({"prompt": "Hello there", "n_predict": 16, "temperature": 0}).encode()
            request = urllib.request.Request(f"{url}/completion", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=RUN_TIMEOUT_S) as response:
                answer = json.load(response)
            assert answer["tokens_predicted"] == 16
            assert answer["timings"].get("draft_n", 0) > 0, answer["timings"]
        finally:
            server.terminate()
            server.wait(timeout=30)
