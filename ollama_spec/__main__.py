"""`python -m ollama_spec`: the CLI without the console script (e.g. from a source tree on PYTHONPATH)."""

from .cli import main

main()
