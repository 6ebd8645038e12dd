"""Turn what scripts/gpu-session.sh brought back from a GPU machine into docs/benchmarks/NAME/.

    python scripts/gpu_results.py SESSION_OUT docs/benchmarks/h200-8b-1b

SESSION_OUT holds device.txt, bench's results.json and results.md, offload.txt, serve.txt (any may be
missing: a run cut off by its time limit still tells something). Writes results.json (the device, the
commit, bench's own results, llama.cpp's offload lines next to `check`'s estimate, the served rates and
ratios) and results.md (the same for reading; bench's table as bench wrote it).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

RATIO = re.compile(r"^(\d+) client\(s\):\s+(.*)$")
RATE = re.compile(r"([\d.]+) / ([\d.]+)(?: \(K=(\d+)\))? = ([\d.]+)x")  # ours / llama-server (its best K) = ratio


def read(folder: Path, name: str) -> str:
    path = folder / name
    return path.read_text() if path.exists() else ""


def device_facts(text: str) -> dict[str, str]:
    """device.txt's `key: value` lines."""
    facts: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(": ")
        if sep and key and "/" not in key:  # not a shell error line (scripts/x.sh: line N)
            facts.setdefault(key.strip(), value.strip())
    return facts


def served_ratios(text: str) -> dict[str, list[dict[str, float | int | None]]]:
    """serve.txt's closing table: per client count, each round's ours / llama-server (at its best K)."""
    ratios: dict[str, list[dict[str, float | int | None]]] = {}
    for line in text.splitlines():
        match = RATIO.match(line.strip())
        if not match:
            continue
        rounds = [
            {
                "ours": float(ours),
                "llama_server": float(native),
                "llama_server_k": int(k) if k else None,
                "ratio": float(ratio),
            }
            for ours, native, k, ratio in RATE.findall(match.group(2))
        ]
        if rounds:
            ratios[match.group(1)] = rounds
    return ratios


def main(source: Path, dest: Path) -> None:
    device = device_facts(read(source, "device.txt"))
    bench_json = read(source, "results.json")
    served = read(source, "serve.txt")
    offload = read(source, "offload.txt")
    results = {
        "device": device,
        "bench": json.loads(bench_json) if bench_json else None,
        "offload": offload.splitlines(),
        "served": {"ratios_by_clients": served_ratios(served), "log": served.splitlines()},
    }
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    header = "\n".join(f"- {key}: {value}" for key, value in device.items())
    bench_md = read(source, "results.md").strip() or "(no bench table: the run stopped before it)"
    bench_md = "\n".join(line for line in bench_md.splitlines() if "](bench.png)" not in line)  # not brought back
    parts = [
        "# GPU benchmark: the 8B-shaped pair (scripts/gpu-session.sh)",
        header,
        "## In process (`bench`)",
        bench_md.split("\n", 1)[1].strip() if bench_md.startswith("# ") else bench_md,
        "## Offload: llama.cpp's load log next to `check`'s estimate",
        f"```\n{offload.strip() or '(not reached)'}\n```",
        "## Served: ours (`serve --parallel 4`, defaults) and llama-server `-np 4`, the same draft",
        f"```\n{served.strip() or '(not reached)'}\n```",
    ]
    (dest / "results.md").write_text("\n\n".join(parts) + "\n")
    print(f"wrote {dest / 'results.json'} and {dest / 'results.md'}")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python scripts/gpu_results.py SESSION_OUT DEST_DIR")
    main(Path(sys.argv[1]), Path(sys.argv[2]))
