"""The `ollama-spec` command line. `main` is the console-script entry point."""

from . import check, generate, inspect  # noqa: F401  (each module registers its commands on `cli`)
from . import bench  # noqa: F401  (registers `bench`)
from . import pull  # noqa: F401  (registers `pull`)
from . import doctor  # noqa: F401  (registers `doctor`)
from . import serve  # noqa: F401  (registers `serve`)
from . import drafts  # noqa: F401  (registers `drafts`)
from . import chat  # noqa: F401  (registers `chat`)
from .main import cli


def main() -> None:
    cli(prog_name="ollama-spec")


__all__ = ["cli", "main"]
