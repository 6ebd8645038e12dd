"""A stand-in `vllm` program on disk, for `ollama-spec vllm --run` without vLLM."""

from pathlib import Path


def fake_vllm(folder: Path, version: str = "0.16.0", *, status: int = 0) -> Path:
    """A `vllm` program that prints `version` for --version and records any other call."""
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / "vllm"
    program.write_text(f"""#!/bin/sh
if [ "$1" = "--version" ]; then echo "INFO some log line"; echo "{version}"; exit {status}; fi
printf '%s\\n' "$@" > "{folder / "called"}"
""")
    program.chmod(0o755)
    return program
