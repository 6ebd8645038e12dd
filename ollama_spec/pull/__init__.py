"""Getting models into Ollama's store: through the daemon, straight from a registry, or from Hugging Face.

Only this package writes to the store (through `writer.StoreWriter`); everything else reads it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from ollama_spec.config import ollama_var
from ollama_spec.errors import InvalidSetting, ModelNotFound, OllamaSpecError, StoreNotFound
from ollama_spec.models.names import ModelRef, parse_model_name
from ollama_spec.models.store import Store, find_store_root
from ollama_spec.pull.daemon import Daemon, probe_daemon, pull_through_daemon
from ollama_spec.pull.huggingface import endpoint_overridden, is_huggingface, pull_from_huggingface
from ollama_spec.pull.progress import PullEvent, make_reporter
from ollama_spec.pull.registry import pull_from_registry
from ollama_spec.pull.settings import VIAS, PullSettings
from ollama_spec.pull.writer import StoreWriter, writable_store_root

__all__ = ["VIAS", "PullEvent", "PullSettings", "choose_via", "make_reporter", "pull_head_model", "pull_models"]


def choose_via(ref: ModelRef, settings: PullSettings, daemon_up: Callable[[], bool]) -> str:
    """--via if given; else the daemon when it answers; else the registry named in the model.

    hf.co names too go to their registry (hf.co speaks Ollama's registry protocol and adds the
    chat template and parameters Ollama needs, exactly what `ollama pull` stores), except when
    HF_ENDPOINT names a mirror, which speaks only the Hugging Face Hub's API."""
    if settings.via == "hf" and not is_huggingface(ref):
        raise InvalidSetting(f"--via hf needs a Hugging Face name (hf.co/<user>/<repo>[:quant]), not '{ref.display}'")
    if settings.via:
        return settings.via
    if daemon_up():
        return "ollama"
    return "hf" if is_huggingface(ref) and endpoint_overridden() else "registry"


def pull_models(
    names: Sequence[str],
    settings: PullSettings,
    report: Callable[[PullEvent], None],
    models_dir: str | None = None,
) -> list[tuple[str, str]]:
    """Pull each name in turn; return (name, path taken). Stops at the first failure.

    With --models-dir the daemon is not used: it writes to its own store.
    """
    refs = [(name, parse_model_name(name)) for name in names]
    for name, _ in refs:
        if name.strip().lower().startswith("http://") and not settings.insecure:
            raise InvalidSetting(f"'{name}' asks for plain HTTP; add --insecure to allow it")
    if settings.via == "ollama" and models_dir is not None:
        raise InvalidSetting("--via ollama writes into the daemon's own store, not --models-dir: drop one of the two")
    answers: list[Daemon] = []

    def daemon_up() -> bool:
        if models_dir is not None:
            return False
        if not answers:
            answers.append(probe_daemon(settings.daemon_host))
            if answers[0] is Daemon.OLLAMA_SPEC:
                report(
                    PullEvent(
                        refs[0][1].display,
                        f"{settings.daemon_host} is an ollama-spec server, not the Ollama "
                        "daemon: pulling straight from the registry",
                    )
                )
        return answers[0] is Daemon.OLLAMA

    writer: StoreWriter | None = None
    taken = []
    for name, ref in refs:
        via = choose_via(ref, settings, daemon_up)
        if via == "ollama":
            pull_through_daemon(name.strip(), settings.daemon_host, settings.insecure, report)
            _warn_unless_readable(ref, settings.daemon_host, report)
        else:
            if writer is None:
                writer = StoreWriter(writable_store_root(models_dir))
            writer.prepare(ref)
            pull = pull_from_huggingface if via == "hf" else pull_from_registry
            pull(ref, writer, settings, report, threading.Event())
        taken.append((ref.display, via))
    return taken


def pull_head_model(
    source: str,
    target: str,
    settings: PullSettings,
    report: Callable[[PullEvent], None],
    models_dir: str | None = None,
    *,
    name: str | None = None,
    verify: Callable[[Path], object] | None = None,
) -> str:
    """Convert the EAGLE-3 head at `source` (hf.co/<user>/<repo> or a folder) for `target` into the store that
    holds `target`, straight (the daemon cannot convert); return the name it is stored as."""
    if settings.via == "ollama":
        raise InvalidSetting("--head-for converts the head here and writes the store itself: drop --via ollama")
    from ollama_spec.pull.head_pull import pull_head  # numpy and gguf: only when converting

    writer = StoreWriter(writable_store_root(models_dir))
    return pull_head(source, target, writer, settings, report, threading.Event(), name=name, verify=verify)


def _warn_unless_readable(ref: ModelRef, host: str, report: Callable[[PullEvent], None]) -> None:
    """The daemon writes into its own store; when OLLAMA_MODELS names another one, ollama-spec
    (which reads OLLAMA_MODELS) will not find what was just pulled: say so now, not at the next command."""
    if not ollama_var("OLLAMA_MODELS"):
        return
    try:
        Store(find_store_root()).resolve(ref.display)
    except (ModelNotFound, StoreNotFound):  # elsewhere, or OLLAMA_MODELS names no store at all
        report(
            PullEvent(
                ref.display,
                f"warning: the Ollama daemon at {host} stored it outside OLLAMA_MODELS="
                f"{ollama_var('OLLAMA_MODELS')}, where ollama-spec looks: set OLLAMA_MODELS to the daemon's "
                "store, or pull with --via registry",
            )
        )
    except OllamaSpecError:
        pass  # a store problem the next command reports in full
