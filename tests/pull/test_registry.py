"""`ollama-spec pull` straight from a registry: real HTTP on 127.0.0.1, the tiny synthetic models."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ollama_spec.models.store import Store, StoreRoot
from ollama_spec.pull import PullSettings, pull_models
from tests.pull_servers import BlobStorage, Registry, closed_port, snapshot

PARTIAL = ".ollama-spec-partial"


@pytest.fixture
def registry(tiny_store, monkeypatch):
    server = Registry(tiny_store)
    monkeypatch.setenv("OLLAMA_HOST", f"http://127.0.0.1:{closed_port()}")  # no daemon: the registry path
    yield server
    server.close()


@pytest.fixture
def store(tmp_path) -> Path:
    root = tmp_path / "store"
    root.mkdir()
    return root


def leftovers(store: Path) -> list[str]:
    """Files in the partial folder (downloads kept for the next pull)."""
    return sorted(p.name for p in (store / PARTIAL).glob("*")) if (store / PARTIAL).exists() else []


def without_partials(files: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in files.items() if not k.startswith(PARTIAL)}


def name(registry, model: str) -> str:
    return f"{registry.host}/library/{model}:latest"


def source_layers(tiny_store, model: str) -> list[dict]:
    doc = json.loads((tiny_store / "manifests/registry.ollama.ai/library" / model / "latest").read_text())
    return doc["layers"] + [doc["config"]]


def model_digest(tiny_store, model: str) -> str:
    return next(layer["digest"] for layer in source_layers(tiny_store, model) if layer["mediaType"].endswith("model"))


def pull(invoke, store, *names, **kwargs):
    return invoke("pull", *names, "--insecure", "--models-dir", store, **kwargs)


def test_pull_pair_through_redirect_then_list_show_generate(invoke, registry, store, tiny_store):
    storage = BlobStorage({})
    storage.blobs = {
        layer["digest"]: registry.blob(layer["digest"])
        for m in ("tiny-target", "tiny-draft")
        for layer in source_layers(tiny_store, m)
    }
    registry.behaviour.redirect = storage.url
    try:
        result = pull(invoke, store, name(registry, "tiny-target"), name(registry, "tiny-draft"))
    finally:
        storage.close()
    assert result.exit_code == 0, result.output
    assert "success" in result.output and "via registry" in result.output
    for model in ("tiny-target", "tiny-draft"):
        manifest = store / "manifests" / registry.host / "library" / model / "latest"
        assert manifest.read_bytes() == registry.manifest(f"library/{model}/latest")
    assert all(any(path.endswith(digest) for _, path, _ in storage.requests) for digest in storage.blobs)
    assert leftovers(store) == []
    assert sorted(p.name for p in (store / "blobs").iterdir()) == sorted(d.replace(":", "-") for d in storage.blobs)

    listed = invoke("list", "--models-dir", store, "--json")
    assert {m["name"] for m in json.loads(listed.output)["models"]} == {
        name(registry, "tiny-target"),
        name(registry, "tiny-draft"),
    }
    shown = invoke("show", name(registry, "tiny-target"), "--verify", "--models-dir", store)
    assert shown.exit_code == 0, shown.output
    generated = invoke(
        "generate",
        name(registry, "tiny-target"),
        "Hi",
        "-d",
        name(registry, "tiny-draft"),
        "-n",
        "4",
        "--threads",
        "1",
        "--no-check",
        "-t",
        "0",
        "--models-dir",
        store,
    )
    assert generated.exit_code == 0, generated.output


def test_blobs_already_present_are_skipped(invoke, registry, store, tiny_store):
    assert pull(invoke, store, name(registry, "tiny-target")).exit_code == 0
    before = len(registry.requests)
    result = pull(invoke, store, name(registry, "tiny-draft"))
    assert result.exit_code == 0, result.output
    fetched = {path.rsplit("/", 1)[-1] for _, path, _ in registry.requests[before:] if "/blobs/" in path}
    target = {layer["digest"] for layer in source_layers(tiny_store, "tiny-target")}
    draft = {layer["digest"] for layer in source_layers(tiny_store, "tiny-draft")}
    assert fetched == draft - target and target & draft  # shared template/params/license not fetched again


def test_json_prints_one_object_per_line(invoke, registry, store):
    result = pull(invoke, store, name(registry, "tiny-target"), "--json")
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.output.splitlines()]
    assert rows[0]["status"] == "pulling manifest" and rows[-1]["status"] == "success"
    done = [r for r in rows if r.get("digest") and r.get("completed") == r.get("total")]
    assert len({r["digest"] for r in done}) == 5  # model, template, license, params, config


def test_dropped_connection_is_resumed_with_range(invoke, registry, store, tiny_store):
    digest = model_digest(tiny_store, "tiny-target")
    size = len(registry.blob(digest))
    registry.behaviour.drop_after, registry.behaviour.drops = size // 2, 1
    registry.behaviour.drop_digest = digest
    result = pull(invoke, store, name(registry, "tiny-target"))
    assert result.exit_code == 0, result.output
    assert registry.blob_gets(digest) == [None, f"bytes={size // 2}-"]
    assert invoke("show", name(registry, "tiny-target"), "--verify", "--models-dir", store).exit_code == 0


def test_pull_that_keeps_failing_keeps_the_partial_and_the_next_pull_resumes(
    invoke, registry, store, tiny_store, monkeypatch
):
    monkeypatch.setattr("ollama_spec.pull.download.BACKOFF", 0.01)
    digest = model_digest(tiny_store, "tiny-target")
    size = len(registry.blob(digest))
    registry.behaviour.drop_after, registry.behaviour.drops = size // 2, -1
    registry.behaviour.drop_digest = digest
    before = snapshot(store)
    failed = pull(invoke, store, name(registry, "tiny-target"))
    assert failed.exit_code == 1
    assert "partial download is kept: run the same pull again to resume" in failed.output
    assert without_partials(snapshot(store)) == before
    partial = store / PARTIAL / f"sha256-{digest[7:]}.partial"
    assert partial.stat().st_size == size // 2

    registry.behaviour.drops = 0
    registry.requests.clear()
    result = pull(invoke, store, name(registry, "tiny-target"))
    assert result.exit_code == 0, result.output
    assert registry.blob_gets(digest) == [f"bytes={size // 2}-"]
    assert leftovers(store) == []
    assert invoke("show", name(registry, "tiny-target"), "--verify", "--models-dir", store).exit_code == 0


def test_busy_answers_are_retried_and_a_moving_download_never_runs_out_of_tries(
    invoke, registry, store, tiny_store, monkeypatch
):
    monkeypatch.setattr("ollama_spec.pull.download.BACKOFF", 0.01)
    monkeypatch.setattr("ollama_spec.pull.download.RETRIES", 3)  # fewer tries than drops: progress resets them
    digest = model_digest(tiny_store, "tiny-target")
    size = len(registry.blob(digest))
    registry.behaviour.busy = [429, 503]  # a CDN that is busy twice, as Ollama's own retries expect
    # then a link that drops after every 1/8 of the blob: more drops than tries, but each try makes progress
    registry.behaviour.drop_after, registry.behaviour.drops, registry.behaviour.drop_digest = size // 8, 6, digest
    registry.behaviour.drop_each = True
    result = pull(invoke, store, name(registry, "tiny-target"), "--concurrency", "1")
    assert result.exit_code == 0, result.output
    assert len(registry.blob_gets(digest)) >= 7  # the drops happened: seven tries after the busy answers
    assert invoke("show", name(registry, "tiny-target"), "--verify", "--models-dir", store).exit_code == 0


def test_a_server_busy_every_time_gives_up_with_its_words(invoke, registry, store, monkeypatch):
    monkeypatch.setattr("ollama_spec.pull.download.BACKOFF", 0.01)
    registry.behaviour.busy = [503] * 100
    result = pull(invoke, store, name(registry, "tiny-target"))
    assert result.exit_code == 1
    last = result.output.splitlines()[-1]
    assert "after 6 tries in a row (HTTP 503:" in last and "slow down" in last
    assert last.endswith("run the same pull again later")  # nothing received: no partial is kept


def test_a_name_in_other_case_updates_the_stored_manifest(invoke, registry, store, tiny_store):
    assert pull(invoke, store, name(registry, "tiny-draft")).exit_code == 0
    source = tiny_store / "manifests/registry.ollama.ai"
    (source / "LIBRARY/Tiny-Draft").mkdir(parents=True)
    (source / "LIBRARY/Tiny-Draft/LATEST").write_bytes((source / "library/tiny-draft/latest").read_bytes())
    try:
        assert pull(invoke, store, f"{registry.host}/LIBRARY/Tiny-Draft:LATEST").exit_code == 0
    finally:
        (source / "LIBRARY/Tiny-Draft/LATEST").unlink()
        (source / "LIBRARY/Tiny-Draft").rmdir()
        (source / "LIBRARY").rmdir()
    manifests = sorted(str(p.relative_to(store)) for p in (store / "manifests").rglob("*") if p.is_file())
    assert manifests == [f"manifests/{registry.host}/library/tiny-draft/latest"]


def test_server_that_ignores_range_restarts_the_blob(invoke, registry, store, tiny_store, monkeypatch):
    digest = model_digest(tiny_store, "tiny-target")
    partial = store / PARTIAL / f"sha256-{digest[7:]}.partial"
    partial.parent.mkdir()
    partial.write_bytes(b"\0" * 1000)  # not even the right bytes: only the sha256 check can tell
    registry.behaviour.ignore_range = True
    result = pull(invoke, store, name(registry, "tiny-target"))
    assert result.exit_code == 0, result.output
    assert invoke("show", name(registry, "tiny-target"), "--verify", "--models-dir", store).exit_code == 0


def test_corrupt_partial_from_before_fails_the_digest_check_and_is_deleted(invoke, registry, store, tiny_store):
    digest = model_digest(tiny_store, "tiny-target")
    partial = store / PARTIAL / f"sha256-{digest[7:]}.partial"
    partial.parent.mkdir()
    partial.write_bytes(b"\0" * 1000)
    before = snapshot(store)
    result = pull(invoke, store, name(registry, "tiny-target"))
    assert result.exit_code == 1
    assert f"blob {digest}" in result.output and "does not match its digest" in result.output
    assert not partial.exists() and without_partials(snapshot(store)) == without_partials(before)


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("unknown", "not found at http://"),
        ("unreachable", "cannot reach the registry at http://127.0.0.1:"),
        ("corrupt", "does not match its digest"),
        ("bad-digest", "invalid layer digest 'sha256:xyz'"),
        ("bigger", "but the manifest says"),
        ("missing-blob", "answered 404: there is no blob sha256:0000"),
        ("loop", "too many redirects"),
        ("disk-full", "not enough disk space"),
        ("not-writable", "not writable by you"),
        ("http-without-insecure", "add --insecure"),
    ],
)
def test_failures_leave_the_store_exactly_as_it_was(invoke, registry, store, tiny_store, monkeypatch, setup, message):
    assert pull(invoke, store, name(registry, "tiny-draft")).exit_code == 0  # something to keep intact
    model = "tiny-target"
    args = [name(registry, model), "--insecure"]
    doc = json.loads(registry.manifest(f"library/{model}/latest"))
    if setup == "unknown":
        model = "nope"
        args[0] = name(registry, "nope")
    elif setup == "unreachable":
        args[0] = f"127.0.0.1:{closed_port()}/library/{model}:latest"
    elif setup == "corrupt":
        registry.behaviour.corrupt = {model_digest(tiny_store, model)}
    elif setup == "bad-digest":
        doc["layers"][1]["digest"] = "sha256:xyz"
        registry.behaviour.manifests[f"library/{model}/latest"] = json.dumps(doc).encode()
    elif setup == "missing-blob":
        doc["layers"][1]["digest"] = "sha256:" + "0" * 64
        registry.behaviour.manifests[f"library/{model}/latest"] = json.dumps(doc).encode()
    elif setup == "bigger":
        doc["layers"][0]["size"] += 10
        registry.behaviour.manifests[f"library/{model}/latest"] = json.dumps(doc).encode()
    elif setup == "loop":
        registry.behaviour.redirect = f"{registry.url}/v2/library/{model}/blobs"
    elif setup == "disk-full":
        monkeypatch.setattr("ollama_spec.pull.writer.free_bytes", lambda path: 1 << 20)
    elif setup == "not-writable":

        def refuse(*a, **k):
            raise PermissionError(13, "Permission denied")

        monkeypatch.setattr("ollama_spec.pull.writer.tempfile.mkstemp", refuse)
        monkeypatch.setattr("ollama_spec.pull.writer.probe_writable", refuse)
    elif setup == "http-without-insecure":
        args = [f"http://{name(registry, model)}"]
    before = snapshot(store)
    result = invoke("pull", *args, "--models-dir", store)
    assert result.exit_code == 1, result.output
    assert message in result.output
    assert result.output.splitlines()[-1].startswith("Error: ") and "Traceback" not in result.output
    after = snapshot(store)
    assert without_partials(after) == before  # blobs/ and manifests/ untouched
    if setup in ("corrupt", "missing-blob", "bigger"):
        # Other blobs of the model may have started or finished meanwhile: they wait in the partial
        # folder for the next pull. The model blob's is gone when the fault was in that blob.
        if setup != "missing-blob":
            assert f"sha256-{model_digest(tiny_store, model)[7:]}.partial" not in leftovers(store)
    else:
        assert after == before


def test_not_writable_says_how_to_fix(invoke, registry, store, monkeypatch):
    def refuse(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("ollama_spec.pull.writer.tempfile.mkstemp", refuse)
    monkeypatch.setattr("ollama_spec.pull.writer.probe_writable", refuse)
    result = pull(invoke, store, name(registry, "tiny-target"))
    assert "group ollama" in result.output and "OLLAMA_MODELS=" in result.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_read_only_store_directory(invoke, registry, store):
    store.chmod(0o555)
    try:
        result = pull(invoke, store, name(registry, "tiny-target"))
    finally:
        store.chmod(0o755)
    assert result.exit_code == 1 and "not writable by you" in result.output


def test_blobs_download_concurrently_within_the_bound(invoke, registry, store):
    registry.behaviour.delay = 0.05
    assert pull(invoke, store, name(registry, "tiny-target"), "--concurrency", "2").exit_code == 0
    assert registry.max_inflight == 2


def test_two_pulls_of_the_same_model_at_once(registry, store, tiny_store):
    registry.behaviour.delay = 0.02
    errors = []

    def run():
        try:
            pull_models([name(registry, "tiny-target")], PullSettings(insecure=True), lambda e: None, str(store))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    for layer in source_layers(tiny_store, "tiny-target"):
        assert registry.blob_gets(layer["digest"]) == [None]  # the second pull waited, then skipped it
    model = Store(StoreRoot(store, "test")).resolve(name(registry, "tiny-target"))
    from ollama_spec.models.blobs import verify_blob
    from ollama_spec.models.store import blob_path

    for layer in model.layers:
        verify_blob(blob_path(store, layer.digest), layer)
    assert leftovers(store) == []


def test_ctrl_c_keeps_the_partial_and_the_next_pull_resumes(invoke, registry, store, tiny_store):
    digest = model_digest(tiny_store, "tiny-target")
    registry.behaviour.delay = 0.2  # ~10 s for the blob: room for Ctrl-C on a loaded machine
    partial = store / PARTIAL / f"sha256-{digest[7:]}.partial"
    env = os.environ | {"PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from ollama_spec.cli import main; main()",
            "pull",
            "--insecure",
            "--models-dir",
            str(store),
            name(registry, "tiny-target"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        # A run started in the background inherits an ignored SIGINT, and Python then keeps ignoring
        # it: the pull would finish instead of stopping.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size > 0) and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output
    assert "partial downloads are kept" in output
    kept = partial.stat().st_size
    assert 0 < kept < len(registry.blob(digest))
    assert not any(path.is_file() for path in (store / "manifests").rglob("*"))

    registry.behaviour.delay = 0
    registry.requests.clear()
    result = pull(invoke, store, name(registry, "tiny-target"))
    assert result.exit_code == 0, result.output
    assert registry.blob_gets(digest) == [f"bytes={kept}-"]
    assert invoke("show", name(registry, "tiny-target"), "--verify", "--models-dir", store).exit_code == 0


def test_a_pull_started_with_its_output_closed_still_pulls(registry, store, tiny_store):
    """`ollama-spec pull m >&- 2>&-` (cron, daemons): Python has no sys.stdout then; as Ollama, the
    pull goes on without its progress."""
    env = {**os.environ, "OLLAMA_HOST": os.environ["OLLAMA_HOST"]}
    code = (
        "import sys; from ollama_spec.cli import main; "
        f"sys.argv = ['ollama-spec', 'pull', '--insecure', '--models-dir', {str(store)!r}, "
        f"{name(registry, 'tiny-draft')!r}]; main()"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
        timeout=120,
        pass_fds=(),
        close_fds=True,
        preexec_fn=lambda: (os.close(1), os.close(2)),
    )
    assert proc.returncode == 0
    assert Store(StoreRoot(store, "test")).resolve(name(registry, "tiny-draft")).gguf_path.exists()
