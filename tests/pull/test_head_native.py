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


@pytest.mark.parametrize("kind", ["crafted", "reduced"])
def test_a_crafted_head_written_back_as_checkpoints_converts_to_the_same_drafts(tiny_store, tmp_path, kind):
    """The run-time side's crafted heads (written with gguf, independently of the converter) go back to
    checkpoints in both layouts and through the converter: the same file, and llama.cpp accepts as many."""
    builders = pytest.importorskip("tests.builders.eagle3_heads")
    from gguf import GGUFReader

    from ollama_spec.pull.head_checkpoint import iter_tensors, read_head_config, weight_files
    from ollama_spec.pull.head_convert import convert_head
    from ollama_spec.synthetic.eagle3_checkpoint import checkpoint_from_gguf

    target = resolve_model("tiny-target", str(tiny_store))
    original = builders.build_heads(target.path, tmp_path)[kind]
    converted = []
    for layout in ("eagle", "speculators"):
        folder = checkpoint_from_gguf(original, tmp_path / layout, layout)
        config = read_head_config(folder / "config.json", str(folder))
        out = tmp_path / f"{layout}.gguf"
        convert_head(config, list(iter_tensors(weight_files(folder), str(folder))), target.info, target.name, out)
        a, b = ({t.name: t for t in GGUFReader(path).tensors} for path in (original, out))
        assert set(a) == set(b)
        assert all(bytes(a[n].data) == bytes(b[n].data) and a[n].tensor_type == b[n].tensor_type for n in a)
        converted.append(out)
    binary = native_binary("llama-speculative-simple")
    if binary is None:
        return
    counts = [native_counts(binary, target.path, head) for head in [original, *converted]]
    assert counts[0][1] > 0 and len(set(counts)) == 1, counts  # (drafted, accepted) alike, and some accepted


def native_counts(binary: Path, target: Path, head: Path) -> tuple[int, int]:
    args = ["-m", target, "-md", head, "--spec-type", "draft-eagle3", "--spec-draft-n-max", "4"]
    args += ["-p", "Hello there", "-n", "48", "-t", "1", "--temp", "0"]
    for _ in range(3):  # llama.cpp's logger now and then loses the report at exit
        done = subprocess.run(
            [str(binary), *map(str, args)],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            env=native_env(binary),
        )
        assert done.returncode == 0, done.stderr[-2000:]
        found = [re.search(rf"{name}\s*=\s*(\d+)", done.stderr + done.stdout) for name in ("n_drafted", "n_accept")]
        if all(found):
            return int(found[0].group(1)), int(found[1].group(1))
    pytest.fail("llama-speculative-simple reported no counts in three runs")
