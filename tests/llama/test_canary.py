"""The repack canary: its decision logic with a fake runner, its cache, and one real run."""

from __future__ import annotations

import json
import logging
import subprocess

import pytest

from ollama_spec.errors import InvalidSetting
from ollama_spec.llama import canary
from ollama_spec.llama.canary import ENV_VAR, decide_repack

REPACKING_CPU = frozenset({"AVX2", "REPACK"})


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    """A fresh cache per test: each starts with no verdict."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


class FakeRunner:
    """Stands in for the subprocess: returns an exit status and output, or times out."""

    def __init__(self, returncode: int = 0, stdout: str = "canary ok\n", stderr: str = "", timeout: bool = False):
        self.returncode, self.stdout, self.stderr, self.timeout = returncode, stdout, stderr, timeout
        self.calls: list[list[str]] = []

    def __call__(self, command, timeout):
        self.calls.append(list(command))
        if self.timeout:
            raise subprocess.TimeoutExpired(command, timeout)
        return subprocess.CompletedProcess(command, self.returncode, self.stdout, self.stderr)


def test_a_clean_run_keeps_repacking_and_is_cached():
    runner = FakeRunner()
    first = decide_repack(runner=runner, features=REPACKING_CPU)
    assert (first.enabled, first.source, first.fresh, first.note) == (True, "canary", True, None)
    assert runner.calls[0][1:3] == ["-m", "ollama_spec.llama.canary"] and len(runner.calls[0]) == 5  # Q4_0 and Q8_0
    again = decide_repack(runner=runner, features=REPACKING_CPU)
    assert (again.enabled, again.source, again.fresh) == (True, "cached canary", False) and len(runner.calls) == 1


def test_a_crash_turns_repacking_off_and_says_so_once():
    runner = FakeRunner(returncode=-11, stdout="")
    decision = decide_repack(runner=runner, features=REPACKING_CPU)
    assert decision.enabled is False and decision.detail == "the test run died with SIGSEGV"
    assert decision.note == (
        "llama.cpp's repacked CPU weights failed a test run on this machine (the test run died with SIGSEGV); "
        f"loading without them (use_extra_bufts=false). Force with --repack or {ENV_VAR}=1."
    )
    cached = decide_repack(runner=FakeRunner(), features=REPACKING_CPU)
    assert cached.enabled is False and cached.note is None  # said once, remembered


def test_a_timeout_or_an_error_exit_also_turns_it_off():
    timed_out = decide_repack(runner=FakeRunner(timeout=True), features=REPACKING_CPU)
    assert not timed_out.enabled and timed_out.detail == f"the test run did not finish in {canary.TIMEOUT_S:g} s"
    canary._cache_file().unlink()
    failed = decide_repack(
        runner=FakeRunner(returncode=1, stdout="", stderr="Traceback\nValueError: boom"), features=REPACKING_CPU
    )
    assert not failed.enabled and failed.detail == "the test run failed with exit status 1: ValueError: boom"
    canary._cache_file().unlink()
    silent = decide_repack(runner=FakeRunner(stdout=""), features=REPACKING_CPU)  # exit 0 without saying ok
    assert not silent.enabled


def test_a_changed_machine_runs_the_canary_again():
    decide_repack(runner=FakeRunner(returncode=-11), features=REPACKING_CPU)
    data = json.loads(canary._cache_file().read_text())
    data["key"]["kernel"] = "an older kernel"
    canary._cache_file().write_text(json.dumps(data))
    runner = FakeRunner()
    assert decide_repack(runner=runner, features=REPACKING_CPU).enabled and len(runner.calls) == 1
    other_cpu = FakeRunner()
    decide_repack(runner=other_cpu, features=REPACKING_CPU | {"AMX_INT8"})
    assert len(other_cpu.calls) == 1


def test_flags_and_the_environment_win_over_the_canary(monkeypatch):
    never = FakeRunner(timeout=True)
    assert decide_repack(False, runner=never, features=REPACKING_CPU).enabled is False
    monkeypatch.setenv(ENV_VAR, "0")
    assert decide_repack(runner=never, features=REPACKING_CPU).source == ENV_VAR
    assert decide_repack(True, runner=never, features=REPACKING_CPU).enabled is True  # the flag beats the variable
    monkeypatch.setenv(ENV_VAR, "maybe")
    with pytest.raises(InvalidSetting, match=f"^{ENV_VAR}='maybe': use 1 \\(repack\\) or 0 \\(don't\\)$"):
        decide_repack(runner=never, features=REPACKING_CPU)
    assert never.calls == []


def test_no_canary_where_llama_cpp_has_nothing_to_repack():
    never = FakeRunner(timeout=True)
    decision = decide_repack(runner=never, features=frozenset({"AVX2", "FMA"}))
    assert decision.enabled and decision.source == "not built in" and never.calls == []


def test_the_real_canary_decides_and_the_decision_loads(tiny_store):
    """On any CPU: the subprocess run gives a verdict, and a quantized model loads and runs with it."""
    from ollama_spec.llama.model import LoadedModel, LoadSettings
    from ollama_spec.models.store import Store, StoreRoot

    result = canary.run_canary(canary._run, timeout=300)
    assert result.passed or "test run" in result.detail
    decision = decide_repack()
    for name in ("tiny-target:q4_0", "tiny-target:q8_0"):
        path = Store(StoreRoot(tiny_store, "test")).resolve(name).gguf_path
        with LoadedModel(path, LoadSettings(n_ctx=256, n_threads=1, use_extra_bufts=decision.enabled)) as model:
            logits = model.eval([model.bos_token, 300, 301])
            assert logits.shape == (1, 512) and abs(logits).sum() > 0


def test_a_failed_canary_is_said_once_and_check_plans_without_the_copy(invoke, tiny_store, monkeypatch):
    from ollama_spec.llama import backends
    from ollama_spec.planning.devices import system_ram

    crash = FakeRunner(returncode=-11, stdout="")
    monkeypatch.setattr(canary, "_run", crash)
    monkeypatch.setattr(canary, "cpu_features", lambda: REPACKING_CPU)
    monkeypatch.setattr(backends, "cpu_features", lambda: REPACKING_CPU)
    monkeypatch.setattr(backends, "discover_devices", lambda: ([system_ram(8)], []))
    first = invoke("check", "tiny-target:q4_0", "--models-dir", tiny_store)
    assert first.exit_code == 0 and "repacked" not in first.stdout
    assert first.stderr == (
        "note: llama.cpp's repacked CPU weights failed a test run on this machine (the test run died with SIGSEGV); "
        f"loading without them (use_extra_bufts=false). Force with --repack or {ENV_VAR}=1.\n"
    )
    second = invoke("check", "tiny-target:q4_0", "--models-dir", tiny_store)
    assert second.stderr == "" and len(crash.calls) == 1
    forced = invoke("check", "tiny-target:q4_0", "--repack", "--models-dir", tiny_store)
    assert "  repacked " in forced.stdout


@pytest.mark.parametrize("repack", [True, False])
def test_the_engine_loads_with_the_decision(repack, tiny_models, tiny_store):
    """use_extra_bufts reaches llama.cpp: its extra buffers appear exactly when repacking is on and the CPU
    repacks Q4_0."""
    from ollama_spec.engine.engine import Engine
    from ollama_spec.llama import log as llama_log
    from ollama_spec.llama.backends import cpu_features
    from ollama_spec.models.resolve import resolve_model
    from ollama_spec.planning.needs import model_needs
    from tests.conftest import engine_settings

    if repack and not decide_repack().enabled:
        pytest.skip("the canary found llama.cpp's repacked path unsafe on this machine")
    target = resolve_model("tiny-target:q4_0", str(tiny_store))
    llama_log.clear_log()
    with Engine(target, None, engine_settings(repack=repack)) as engine:
        assert engine.repack.enabled is repack
    extra = [line for line in llama_log.recent_log() if "model buffer size" in line and "CPU_Mapped" not in line]
    expected = repack and model_needs(target.info, 2048, repack_features=cpu_features()).repacked > 0
    assert bool(extra) == expected, extra


def test_an_unwritable_cache_still_gets_a_verdict(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the cache folder would be")  # unwritable even for root
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    runner = FakeRunner()
    assert decide_repack(runner=runner, features=REPACKING_CPU).enabled and len(runner.calls) == 1
    assert "ollama-spec-canary-" in runner.calls[0][-1]  # the models were written for this run only
    assert decide_repack(runner=runner, features=REPACKING_CPU).source == "canary"  # nothing cached: asked again


GGUF_WRITER_LINES = ("This GGUF file is for Little Endian only", "Writing the following files")


def test_writing_the_canary_models_keeps_the_gguf_writers_lines_out_of_the_log(tmp_path, caplog, capfd):
    """serve logs at INFO, and its first request may write these models: the writer's own lines are not for it."""
    caplog.set_level(logging.INFO)
    paths = canary.canary_models(tmp_path / "canary")
    assert len(paths) == 2 and all(p.stat().st_size > 0 for p in paths)
    assert not [r for r in caplog.records if r.name.startswith("gguf")]
    assert not any(line in caplog.text for line in GGUF_WRITER_LINES)
    assert capfd.readouterr() == ("", "")
    assert logging.getLogger("gguf.gguf_writer").isEnabledFor(logging.WARNING)  # its warnings still show
