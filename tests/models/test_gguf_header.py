"""Any bytes in a GGUF header end in a ModelInfo or in CorruptGGUF/NotGGUF naming the file.

Property-based (hypothesis, bounded example counts so `make test` stays quick) plus a corpus
of crafted files, each with the one-line message it must give, in bounded time and memory.
"""

from __future__ import annotations

import io
import json
import os
import re
import struct
import time
import tracemalloc

import pytest
from gguf import GGUFValueType
from hypothesis import given
from hypothesis import strategies as st

from ollama_spec.errors import CorruptGGUF, NotGGUF
from ollama_spec.models.gguf_header import MAX_ARRAY_STRINGS, MAX_HEADER_BYTES, read_header
from ollama_spec.models.gguf_info import ModelInfo, read_model_info
from tests.gguf_bytes import TINY, array, header, kv, small_model_header, string, tensor_info, text, u32


def parse(path, data: bytes, size: int | None = None) -> ModelInfo | Exception:
    """Write `data` (extended sparsely to `size`) and read it; the parser's only allowed outcomes."""
    with open(path, "wb") as f:
        f.write(data)
        f.truncate(max(size or 0, len(data)))
    try:
        return read_model_info(path)
    except (CorruptGGUF, NotGGUF) as exc:
        message = str(exc)
        assert str(path) in message and "\n" not in message and len(message) < 400, message
        return exc


@pytest.fixture(scope="module")
def real_header(tmp_path_factory):
    return small_model_header(tmp_path_factory.mktemp("small") / "small.gguf")


@given(data=st.binary(max_size=512))
def test_random_bytes(tmp_path, data):
    parse(tmp_path / "x.gguf", data)


@given(
    body=st.binary(max_size=512),
    version=st.sampled_from([2, 3]),
    counts=st.tuples(st.integers(0, 2**64 - 1) | st.integers(0, 8), st.integers(0, 2**64 - 1) | st.integers(0, 8)),
)
def test_random_bodies_after_a_valid_preamble(tmp_path, body, version, counts):
    parse(tmp_path / "x.gguf", b"GGUF" + struct.pack("<IQQ", version, *counts) + body, size=1 << 20)


@given(st.data())
def test_mutated_real_headers(tmp_path, real_header, data):
    mutated = bytearray(real_header)
    for _ in range(data.draw(st.integers(1, 8))):
        at = data.draw(st.integers(0, len(mutated) - 1))
        action = data.draw(st.sampled_from(["flip", "byte", "u64", "cut", "insert"]))
        if action == "flip":
            mutated[at] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "byte":
            mutated[at] = data.draw(st.integers(0, 255))
        elif action == "u64":  # lengths and counts are u64: make one huge or odd
            value = data.draw(st.sampled_from([0, 1, 2**31, 2**32 - 1, 2**63, 2**64 - 1]))
            mutated[at : at + 8] = struct.pack("<Q", value)
        elif action == "cut":
            del mutated[at : at + data.draw(st.integers(1, 64))]
        else:
            mutated[at:at] = data.draw(st.binary(min_size=1, max_size=16))
    parse(tmp_path / "x.gguf", bytes(mutated), size=len(real_header) + (8 << 20))


def test_truncation_at_every_offset(tmp_path, real_header):
    complete = parse(tmp_path / "x.gguf", real_header, size=64 << 20)
    assert isinstance(complete, ModelInfo) and complete.vocab_size == 300
    path = tmp_path / "cut.gguf"
    tiny = small_model_header(tmp_path / "tiny.gguf", TINY, vocab_size=16)  # every kind of field, 2 KB
    for cut in range(len(tiny)):  # the walker over an in-memory file: every offset
        with pytest.raises((CorruptGGUF, NotGGUF)) as err:
            read_header(io.BytesIO(tiny[:cut]), path, cut)
        assert str(err.value).startswith(f"{path} ") and "\n" not in str(err.value), cut
    for cut in range(0, len(real_header), 97):  # and some through the file system
        assert isinstance(parse(path, real_header[:cut]), (CorruptGGUF, NotGGUF)), cut


VALID_START = (u32("general.alignment", 32),)
CRAFTED = {
    "empty file": (b"", r"is not a GGUF file \(it has only 0 bytes\)"),
    "other format": (b"PK\x03\x04" + b"\0" * 60, r"is not a GGUF file \(it starts with b'PK\\x03\\x04'\)"),
    "version 1": (header(version=1), "is GGUF version 1; only versions 2 and 3 are supported"),
    "version 4": (header(version=4), "is GGUF version 4; only versions 2 and 3 are supported"),
    "version 0": (header(version=0), "is GGUF version 0; only versions 2 and 3 are supported"),
    "big-endian version 7": (b"GGUF" + struct.pack(">IQQ", 7, 0, 0), "is GGUF version 7"),
    "impossible key count": (header(n_kv=2**40), "has an impossible tensor or key count"),
    "impossible tensor count": (header(n_tensors=2**63), "has an impossible tensor or key count"),
    "nested arrays": (
        header(array("deep", GGUFValueType.ARRAY, 1, struct.pack("<IQ", GGUFValueType.ARRAY, 1) * 100_000)),
        "has an array of arrays under key 'deep', which llama.cpp cannot read",
    ),
    "unknown value type": (header(kv("k", 99, b"")), "has an unknown GGUF value type 99 for key 'k'"),
    "unknown array item type": (header(array("k", 13, 1)), "has an unknown GGUF value type 13 in array 'k'"),
    "string longer than the file": (
        header(kv("k", GGUFValueType.STRING, struct.pack("<Q", 2**62))),
        "is truncated inside its GGUF header",
    ),
    "array longer than the file": (
        header(array("k", GGUFValueType.UINT64, 2**61)),
        "has an array longer than the file itself",
    ),
    "key read twice": (header(u32("a", 1), u32("a", 2)), "has the metadata key 'a' twice"),
    "newline in a key": (header(u32("a\nb", 1), u32("a\nb", 2)), r"has the metadata key 'a\\nb' twice"),
    "alignment 0": (header(u32("general.alignment", 0)), "has general.alignment 0, which is not a power of 2"),
    "alignment 3": (header(u32("general.alignment", 3)), "has general.alignment 3, which is not a power of 2"),
    "alignment text": (header(text("general.alignment", "x" * 500)), r"has general.alignment 'xxxx.*\.\.\., which"),
    "five dimensions": (
        header(tensors=tensor_info("t", (1,) * 5), n_tensors=1),
        "has tensor 't' with 5 dimensions \\(at most 4\\)",
    ),
    "negative dimension": (
        header(tensors=tensor_info("t", (2**63,)), n_tensors=1),
        "has tensor 't' with a negative dimension",
    ),
    "tensor twice": (header(tensors=tensor_info("t", (1,)) * 2, n_tensors=2), "has the tensor 't' twice"),
    "tensor past the end": (
        header(*VALID_START, tensors=tensor_info("t", (2**40,)), n_tensors=1),
        "is truncated: its tensors need",
    ),
    "unknown tensor type past the end": (
        header(*VALID_START, tensors=tensor_info("t", (4,), 200, 2**50), n_tensors=1),
        "is truncated: its tensors need",
    ),
}


@pytest.mark.parametrize("name", CRAFTED)
def test_crafted_corpus(tmp_path, name):
    data, message = CRAFTED[name]
    outcome = parse(tmp_path / "x.gguf", data, size=len(data) + 4096 if data else 0)
    assert isinstance(outcome, (CorruptGGUF, NotGGUF)), outcome
    assert re.search(message, str(outcome)), str(outcome)


def bounded(path, data: bytes, size: int) -> tuple[str, float, int]:
    """Read a crafted file; (message, seconds, peak bytes Python allocated)."""
    with open(path, "wb") as f:
        f.write(data)
        f.truncate(size)
    tracemalloc.start()
    start = time.perf_counter()
    try:
        with pytest.raises((CorruptGGUF, NotGGUF)) as err:
            read_model_info(path)
    finally:
        seconds = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return str(err.value), seconds, peak


BOMBS = {
    # A 40 GB sparse file may claim anything the file size allows: nothing may be read or
    # allocated by the claim itself.
    "30 GB string": (
        header(kv("k", GGUFValueType.STRING, struct.pack("<Q", 30 << 30))),
        f"has a GGUF header larger than {MAX_HEADER_BYTES >> 20} MiB",
    ),
    "30 GB numeric array": (
        header(array("k", GGUFValueType.UINT8, 30 << 30)),
        f"has a GGUF header larger than {MAX_HEADER_BYTES >> 20} MiB",
    ),
    "billions of tokens": (
        header(array("tokenizer.ggml.tokens", GGUFValueType.STRING, MAX_ARRAY_STRINGS + 1)),
        f"has more than {MAX_ARRAY_STRINGS} strings in its arrays",
    ),
    "billions of keys": (header(n_kv=1 << 30), "claims 1073741824 metadata keys"),
    "zeros as keys": (header(n_kv=1 << 15), "has the metadata key '' twice"),
    "zeros as tensors": (header(n_tensors=1 << 16), "has the tensor '' twice"),
}


@pytest.mark.parametrize("name", BOMBS)
def test_allocation_and_time_bombs_end_quickly(tmp_path, name):
    data, message = BOMBS[name]
    text_, seconds, peak = bounded(tmp_path / "bomb.gguf", data, 40 << 30)
    assert message in text_
    assert seconds < 2 and peak < 8 << 20, (seconds, peak)


def test_big_but_honest_string_arrays_are_walked_not_kept(tmp_path):
    # 1M short merges that are read but not kept: linear time, no memory per string
    merges = string("a b") * 1_000_000
    data = header(array("tokenizer.ggml.merges", GGUFValueType.STRING, 1_000_000, merges), u32("general.alignment", 32))
    info = parse(tmp_path / "x.gguf", data)
    assert isinstance(info, ModelInfo) and info.metadata["tokenizer.ggml.merges"].count == 1_000_000


def test_unreadable_and_special_files(tmp_path):
    with pytest.raises(CorruptGGUF, match=f"cannot read {tmp_path}: "):
        read_model_info(tmp_path)
    fifo = tmp_path / "fifo.gguf"
    os.mkfifo(fifo)
    with pytest.raises(CorruptGGUF, match="not a regular file"):
        read_model_info(fifo)  # never blocks waiting for a writer


def test_a_store_of_crafted_files_still_lists_and_shows_cleanly(tiny_store, tmp_path, invoke):
    import shutil

    from ollama_spec.synthetic.layout import write_model

    root = tmp_path / "models"
    shutil.copytree(tiny_store, root)
    names = []
    for number, (data, _) in enumerate(CRAFTED.values()):
        blob = tmp_path / f"crafted-{number}.gguf"
        blob.write_bytes(data + b"\0" * 4096)
        names.append(f"crafted-{number}:latest")
        write_model(root, names[-1], blob)
    listed = invoke("list", "--models-dir", root, "--json")
    assert listed.exit_code == 0
    rows = {row["name"]: row for row in json.loads(listed.stdout)["models"]}
    assert all("error" in rows[name] for name in names) and "error" not in rows["tiny-target:latest"]
    for name in names:
        shown = invoke("show", name, "--models-dir", root)
        assert shown.exit_code == 1 and shown.output.startswith(f"Error: {name}") and shown.output.count("\n") == 1
