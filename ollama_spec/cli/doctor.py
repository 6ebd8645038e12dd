"""`doctor`: what this machine offers ollama-spec, in a few lines."""

from __future__ import annotations

import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import click

from ollama_spec.cli.common import echo_json
from ollama_spec.cli.options import json_option, models_dir_option
from ollama_spec.doctor import Facts, find_problems, gather
from ollama_spec.llama.backends import cpu_features, discover_devices
from ollama_spec.llama.canary import ENV_VAR, decide_repack
from ollama_spec.models.gguf_info import format_bytes


@click.command()
@json_option
@models_dir_option
def doctor(as_json: bool, models_dir: str | None) -> None:
    """Report llama-cpp-python, GPU offload, the devices the memory check sees, and the repack verdict.

    Then: the backends compiled into llama.cpp and the devices it sees (free/total memory beside
    nvidia-ml-py's), the Ollama store and daemon (what it holds in GPU memory), and each problem
    found with the one command that fixes it. Exits 1 when it finds a problem, so scripts can tell.

    The repack verdict says whether models load with llama.cpp's repacked copy of CPU weights:
    decided once per machine by a test run in a subprocess (see --repack/--no-repack and
    $OLLAMA_SPEC_REPACK), since on some CPUs that path crashes.

    \b
    Examples:
      ollama-spec doctor
      ollama-spec doctor --json
    """
    try:
        from ollama_spec.llama import load_params as runtime  # loads llama.cpp: doctor is the one command that must
    except (ImportError, OSError, RuntimeError) as exc:
        raise click.ClickException(
            f"llama-cpp-python cannot be loaded ({exc}); reinstall it: pip install --force-reinstall llama-cpp-python"
        ) from None
    try:
        llama_version = version("llama-cpp-python")
    except PackageNotFoundError:
        llama_version = "unknown"
    devices, notes = discover_devices()
    repack = decide_repack()
    features = sorted(cpu_features())
    facts = gather(models_dir)
    problems = find_problems(facts)
    if as_json:
        echo_json(
            {
                "llama_cpp_python": llama_version,
                "gpu_offload": runtime.gpu_offload_supported(),
                "devices": [d.to_json() for d in devices],
                "notes": notes,
                "repack": repack.to_json(),
                "cpu_features": features,
            }
            | _facts_json(facts)
            | {"problems": [p.to_json() for p in problems]}
        )
        if problems:
            raise SystemExit(1)
        return
    offload = "yes" if runtime.gpu_offload_supported() else "no (a CPU-only build)"
    lines = [f"llama-cpp-python  {llama_version}", f"GPU offload       {offload}", "devices"]
    lines += _machine_lines(devices, notes, repack, features)
    lines += _facts_lines(facts)
    lines.append("problems" + ("          none" if not problems else ""))
    for problem in problems:
        lines += [f"  - {problem.what}", f"    fix: {problem.fix}"]
    click.echo("\n".join(lines))
    if problems:
        raise SystemExit(1)


def _machine_lines(devices, notes: list[str], repack, features: list[str]) -> list[str]:
    """Each device's usable memory, the notes on them, the repack verdict and the CPU's features."""
    lines = [f"  {d.name:<28} {format_bytes(d.usable):>10} usable of {format_bytes(d.total)}" for d in devices]
    lines += [f"  note: {note}" for note in notes]
    state = "on" if repack.enabled else "off"
    lines.append(
        f"repack            {state}: {repack.detail} ({repack.source}; force with --repack/--no-repack "
        f"or {ENV_VAR}=1/0)"
    )
    lines.append(f"CPU features      {' '.join(features) or 'unknown'}")
    return lines


def _build_record() -> dict[str, str]:
    # Written by scripts/install-backend.sh (`make install`) into the venv.
    try:
        text = (Path(sys.prefix) / ".llama-backend").read_text()
    except OSError:
        return {}
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def _facts_lines(facts: Facts) -> list[str]:
    lines = []
    record = _build_record()
    if record:
        flags = record.get("cmake_args") or "-"
        lines.append(f"build             {record.get('backend')} by make install (CMAKE_ARGS={flags})")
    if facts.backends is None:
        lines.append("backends          unknown (this llama-cpp-python does not export ggml's backend registry)")
    else:
        lines.append(f"backends          {' '.join(facts.backends.backends)}")
        lines.append("llama.cpp sees")
        nvml = iter(g for g in facts.gpus if g.kind == "cuda")
        for device in facts.backends.devices:
            line = (
                f"  {device.name:<8} {device.description[:24]:<24} {format_bytes(device.free):>10} free of "
                f"{format_bytes(device.total)}"
            )
            if device.type == "gpu" and device.name.startswith("CUDA") and (gpu := next(nvml, None)):
                line += f"  (nvidia-ml-py: {format_bytes(gpu.free)} free of {format_bytes(gpu.total)})"
            lines.append(line)
    lines.append(f"Ollama store      {facts.store or 'not found'}")
    daemon = facts.daemon
    held = ", ".join(
        f"{m.name} ({format_bytes(m.size_vram)} on the GPU, {format_bytes(m.size)} in all)" for m in daemon.models
    )
    state = f"answers; holds {held or 'no model'}" if daemon.reachable else f"not reachable ({daemon.error})"
    lines.append(f"Ollama daemon     {daemon.host}: {state}")
    return lines


def _facts_json(facts: Facts) -> dict:
    return {
        "build": _build_record() or None,
        "backends": facts.backends.to_json() if facts.backends else None,
        "gpus_present": [g.to_json() for g in facts.gpus],
        "store": facts.store,
        "store_error": facts.store_error,
        "ollama_daemon": facts.daemon.to_json(),
    }
