"""`doctor`: what this machine offers ollama-spec, in a few lines."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import click

from ..canary import ENV_VAR, decide_repack
from ..devices import discover_devices
from ..gguf_info import format_bytes
from ..repack import cpu_features
from .main import cli
from .options import echo_json, json_option


@cli.command()
@json_option
def doctor(as_json: bool) -> None:
    """Report llama-cpp-python, GPU offload, the devices the memory check sees, and the repack verdict.

    The repack verdict says whether models load with llama.cpp's repacked copy of CPU weights:
    decided once per machine by a test run in a subprocess (see --repack/--no-repack and
    $OLLAMA_SPEC_REPACK), since on some CPUs that path crashes.

    \b
    Examples:
      ollama-spec doctor
      ollama-spec doctor --json
    """
    try:
        from .. import runtime  # loads llama.cpp: doctor is the one command that must
    except (ImportError, OSError, RuntimeError) as exc:
        raise click.ClickException(f"llama-cpp-python cannot be loaded ({exc}); reinstall it: "
                                   "pip install --force-reinstall llama-cpp-python") from None
    try:
        llama_version = version("llama-cpp-python")
    except PackageNotFoundError:
        llama_version = "unknown"
    devices, notes = discover_devices()
    repack = decide_repack()
    features = sorted(cpu_features())
    if as_json:
        echo_json({"llama_cpp_python": llama_version, "gpu_offload": runtime.gpu_offload_supported(),
                   "devices": [d.to_json() for d in devices], "notes": notes, "repack": repack.to_json(),
                   "cpu_features": features})
        return
    offload = "yes" if runtime.gpu_offload_supported() else "no (a CPU-only build)"
    lines = [f"llama-cpp-python  {llama_version}", f"GPU offload       {offload}", "devices"]
    for device in devices:
        lines.append(f"  {device.name:<28} {format_bytes(device.usable):>10} usable of {format_bytes(device.total)}")
    lines += [f"  note: {note}" for note in notes]
    state = "on" if repack.enabled else "off"
    lines.append(f"repack            {state}: {repack.detail} ({repack.source}; force with --repack/--no-repack "
                 f"or {ENV_VAR}=1/0)")
    lines.append(f"CPU features      {' '.join(features) or 'unknown'}")
    click.echo("\n".join(lines))
