"""Getting models into Ollama's store: through the daemon, straight from a registry, or from Hugging Face.

Only this package writes to the store (through `writer.StoreWriter`); everything else reads it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from ..errors import InvalidSetting
from ..names import ModelRef, parse_model_name
from .daemon import daemon_answers, pull_through_daemon
from .huggingface import is_huggingface, pull_from_huggingface
from .progress import PullEvent, make_reporter
from .registry import pull_from_registry
from .settings import VIAS, PullSettings
from .writer import StoreWriter, writable_store_root

__all__ = ["VIAS", "PullEvent", "PullSettings", "choose_via", "make_reporter", "pull_models"]


def choose_via(ref: ModelRef, settings: PullSettings, daemon_up: Callable[[], bool]) -> str:
    """--via if given; else the daemon when it answers; else Hugging Face for hf.co names; else the registry."""
    if settings.via == "hf" and not is_huggingface(ref):
        raise InvalidSetting(f"--via hf needs a Hugging Face name (hf.co/<user>/<repo>[:quant]), not '{ref.display}'")
    if settings.via:
        return settings.via
    if daemon_up():
        return "ollama"
    return "hf" if is_huggingface(ref) else "registry"


def pull_models(
    names: Sequence[str],
    settings: PullSettings,
    report: Callable[[PullEvent], None],
    models_dir: str | None = None,
) -> list[tuple[str, str]]:
    """Pull each name in turn; return (name, path taken). Stops at the first failure.

    With --models-dir the daemon is not used unless forced: it writes to its own store.
    """
    refs = [(name, parse_model_name(name)) for name in names]
    for name, _ in refs:
        if name.strip().lower().startswith("http://") and not settings.insecure:
            raise InvalidSetting(f"'{name}' asks for plain HTTP; add --insecure to allow it")
    answers: list[bool] = []

    def daemon_up() -> bool:
        if models_dir is not None:
            return False
        if not answers:
            answers.append(daemon_answers(settings.daemon_host))
        return answers[0]

    writer: StoreWriter | None = None
    taken = []
    for name, ref in refs:
        via = choose_via(ref, settings, daemon_up)
        if via == "ollama":
            pull_through_daemon(name.strip(), settings.daemon_host, settings.insecure, report)
        else:
            if writer is None:
                writer = StoreWriter(writable_store_root(models_dir))
            writer.prepare()
            pull = pull_from_huggingface if via == "hf" else pull_from_registry
            pull(ref, writer, settings, report, threading.Event())
        taken.append((ref.display, via))
    return taken
