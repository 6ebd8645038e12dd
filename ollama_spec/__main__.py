"""`python -m ollama_spec`: the CLI without the console script (e.g. from a source tree on PYTHONPATH)."""

from ollama_spec.cli import main

main()
