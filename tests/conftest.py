"""Shared fixtures: every user path points into tmp, and one tiny synthetic store per session."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, settings

from ollama_spec.synthetic import build_pair_store

# Property tests: a bounded number of examples in `make test` (a few seconds), many more with
# HYPOTHESIS_PROFILE=deep. No example database: nothing is written into the checkout.
_FUZZ = {
    "deadline": None,
    "database": None,
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}
settings.register_profile("bounded", max_examples=120, **_FUZZ)
settings.register_profile("deep", max_examples=20_000, **_FUZZ)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "bounded"))


@pytest.fixture(scope="session")
def user_cache(tmp_path_factory) -> Path:
    """One cache directory per session: the repack canary runs at most once, each pair's step costs are
    measured once, and every test after the first starts from them (a test that must see them measured takes
    `own_cache`)."""
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="session", autouse=True)
def one_tls_context():
    """Every httpx client made in the test process (the tests', ollama's and openai's, the server's own)
    shares one default TLS context: building one loads certifi's CA bundle, 30-100 ms a client on this
    machine, and the suite makes hundreds of clients, all for plain HTTP on 127.0.0.1."""
    from httpx._transports import default

    create, made = default.create_ssl_context, {}

    def shared(verify=True, cert=None, trust_env=True):
        if verify is not True or cert is not None:
            return create(verify=verify, cert=cert, trust_env=trust_env)
        key = (trust_env, os.environ.get("SSL_CERT_FILE"), os.environ.get("SSL_CERT_DIR"))
        if key not in made:
            made[key] = create(verify=verify, cert=cert, trust_env=trust_env)
        return made[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(default, "create_ssl_context", shared)
        yield


@pytest.fixture(scope="session", autouse=True)
def uvicorn_stops_at_once():
    """uvicorn servers in the test process (tests/serving.py, tests/live_app.py) look for should_exit every
    0.1 s, then sleep 0.1 s in their shutdown and poll what is still open every 0.1 s: 0.15 s or more a
    server on its way out, some 140 servers in tests/server and tests/engine. Here each of those waits is
    at most 10 ms: the same steps in the same order, polled more often."""
    import asyncio
    import types

    import uvicorn.server

    async def sleep(delay, result=None):
        return await asyncio.sleep(min(delay, 0.01), result)

    quick = types.SimpleNamespace(**vars(asyncio))
    quick.sleep = sleep
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(uvicorn.server, "asyncio", quick)
        yield


@pytest.fixture(autouse=True)
def isolated_user_paths(tmp_path, monkeypatch, user_cache):
    """No test may see the real ~/.ollama, OLLAMA_MODELS or the user's cache."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CACHE_HOME", str(user_cache))
    monkeypatch.delenv("OLLAMA_MODELS", raising=False)
    monkeypatch.delenv("OLLAMA_HOST", raising=False)
    monkeypatch.delenv("OLLAMA_SPEC_REPACK", raising=False)
    return home


@pytest.fixture(autouse=True)
def quiet_machine(monkeypatch):
    """Every timing counts as taken on a quiet machine (engine/cpu_wait.py): what a test expects cached must
    not depend on what else the machine runs. A test of a busy spell says it is one (`busy_spell`)."""
    from ollama_spec.engine import cpu_wait

    monkeypatch.setattr(cpu_wait, "waited_s", lambda: 0.0)


@pytest.fixture
def busy_spell(monkeypatch):
    """Every timing from now on is one the process spent mostly waiting for a CPU: each reading of its
    threads' waits is an hour later than the last (`calm()` ends the spell)."""
    from ollama_spec.engine import cpu_wait

    waited = [0.0]

    def waiting() -> float:
        waited[0] += 3600.0
        return waited[0]

    monkeypatch.setattr(cpu_wait, "waited_s", waiting)

    class Spell:
        @staticmethod
        def calm() -> None:
            monkeypatch.setattr(cpu_wait, "waited_s", lambda: 0.0)

    return Spell()


@pytest.fixture
def own_cache(tmp_path, monkeypatch) -> Path:
    """A cache of this test's own, for a test that must see the canary or a calibration run."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache))
    return cache


def pytest_configure(config):
    config.addinivalue_line("markers", "breaks_store: the test leaves a store inconsistent on purpose")


@pytest.fixture(autouse=True)
def consistent_stores(request, monkeypatch):
    """After every test that wrote to a store (a pull, a delete, a copy), each manifest there names blobs that
    exist with the right sha256. A test that breaks a store on purpose says so: @pytest.mark.breaks_store."""
    from ollama_spec.pull.writer import StoreWriter
    from tests.stores import inconsistencies

    written: set[Path] = set()
    writing = StoreWriter.writing

    def recorded(self, *args, **kwargs):
        written.add(self.path)
        return writing(self, *args, **kwargs)

    monkeypatch.setattr(StoreWriter, "writing", recorded)
    yield
    if request.node.get_closest_marker("breaks_store"):
        return
    for root in sorted(written):
        if (root / "manifests").is_dir():
            assert not inconsistencies(root), f"the store {root} is left inconsistent: {inconsistencies(root)}"


@pytest.fixture(scope="session")
def sparse_dir(tmp_path_factory) -> Path:
    """A folder whose files keep holes: header-only 40 GB models take kilobytes. Skips where they wouldn't."""
    root = tmp_path_factory.mktemp("sparse")
    probe = root / "probe"
    with open(probe, "wb") as f:
        f.write(b"GGUF")
        f.truncate(256 << 20)
    allocated = getattr(os.stat(probe), "st_blocks", None)
    probe.unlink()
    if allocated is None or allocated * 512 >= 64 << 20:
        pytest.skip("this filesystem writes out sparse files in full; header-only 40 GB model tests skipped")
    return root


@pytest.fixture(scope="session")
def tiny_store(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("store")
    build_pair_store(root, "tiny")
    return root


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def invoke(runner):
    """Run the CLI like a user would; returns click's Result."""
    from ollama_spec.cli import cli

    def run(*args: str, **kwargs):
        return runner.invoke(cli, [str(a) for a in args], **kwargs)

    return run


@pytest.fixture(scope="session")
def tiny_models(tiny_store):
    """Resolved tiny target and draft (headers read, nothing loaded)."""
    from ollama_spec.models.resolve import resolve_model

    return resolve_model("tiny-target", str(tiny_store)), resolve_model("tiny-draft", str(tiny_store))


def engine_settings(**kwargs):
    from ollama_spec.engine.engine import EngineSettings

    # One thread: llama.cpp's spinning worker threads crawl when the 2 cores are shared.
    return EngineSettings(**({"n_ctx": 2048, "n_threads": 1, "memory_check": False} | kwargs))


@pytest.fixture(scope="session")
def baseline_engine(tiny_models):
    from ollama_spec.engine.engine import Engine

    with Engine(tiny_models[0], None, engine_settings()) as engine:
        yield engine


@pytest.fixture
def store_copy(tiny_store, tmp_path) -> Path:
    """A copy of the tiny store that a test may change (its manifests, layers, permissions)."""
    root = tmp_path / "models"
    shutil.copytree(tiny_store, root)
    return root


@pytest.fixture(scope="session")
def mtp_store(tmp_path_factory, tiny_store) -> Path:
    """The tiny store and a target that carries NextN (MTP) layers, `mtp-target` (tests/builders/mtp.py)."""
    from tests.builders.mtp import build_mtp_target

    root = tmp_path_factory.mktemp("mtp-store") / "models"
    shutil.copytree(tiny_store, root)
    build_mtp_target(root)
    return root


@pytest.fixture(scope="session")
def spec_engine(tiny_models):
    from ollama_spec.engine.engine import Engine

    with Engine(tiny_models[0], tiny_models[1], engine_settings()) as engine:
        yield engine


@pytest.fixture(scope="session")
def padded_engine(tiny_store, tmp_path_factory):
    """tiny-padded (64 padding tokens past its draft's vocabulary) drafted for by tiny-draft."""
    from ollama_spec.engine.engine import Engine
    from ollama_spec.models.resolve import resolve_model
    from tests.builders.variants import build_padded_target

    root = tmp_path_factory.mktemp("padded-store")
    build_pair_store(root, "tiny")
    name = build_padded_target(root)
    with Engine(resolve_model(name, str(root)), resolve_model("tiny-draft", str(root)), engine_settings()) as engine:
        yield engine


@pytest.fixture
def no_vllm(monkeypatch, tmp_path):
    """A PATH without vLLM, a Python without vllm beside it, and no importable vllm module."""
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python-without-vllm" / "python"))
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    return empty
