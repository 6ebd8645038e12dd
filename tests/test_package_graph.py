"""The packages follow the data's walk: no import cycle between modules or packages, the faces apart.

Read from the source alone (ast, every import statement, those inside functions too: a lazy import is still
a dependency), so it holds without importing anything. `python -m tests.test_package_graph` prints the graph.
"""

from __future__ import annotations

import ast
import graphlib
from collections import defaultdict
from functools import cache
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent / "ollama_spec"

# The walk, from the ground up: a package imports only packages of the layers below its own. A top-level
# module (errors.py) is a package of its own here; the package's own __init__ hands names on by string.
WALK = (
    ("errors", "config"),
    ("prompting",),  # chat messages, templates, text: no model, no llama.cpp
    ("models",),
    ("planning", "synthetic", "pull"),
    ("llama",),
    ("decoding",),
    ("engine", "integrations", "doctor"),
    ("server", "bench"),
    ("cli",),
    ("__main__",),
)
FACES = ("cli", "server", "bench")

# Inside a package, its rooms (the sub-packages and modules right below it) walk the same way: a room imports
# only the rooms of the floors below its own. server/: the serving core knows neither API, each API's wire
# format sits over it, the HTTP face (the app, the routes, the middleware) over both.
ROOMS = {
    "server": (
        ("serving",),
        ("protocol",),
        ("http",),
    ),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _files() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _imported(path: Path, name: str) -> list[tuple[str, int]]:
    """(module of ollama_spec, line) for each name `path` imports from the package."""
    files = _files()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*up, base] if base else up)
            # `from ollama_spec.server import run` imports the module run; `... import ServerState`, the package
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in files else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target not in files and "." in target:
                target = target.rpartition(".")[0]
            if target in files and target != "ollama_spec" and target != name:
                found.append((target, node.lineno))
    return found


@cache
def module_imports() -> dict[str, dict[str, int]]:
    """module -> {module it imports: the first line that does}."""
    graph = {}
    for name, path in _files().items():
        graph[name] = {}
        for target, line in _imported(path, name):
            graph[name].setdefault(target, line)
    return graph


def package_of(module: str) -> str:
    """`ollama_spec.server.serving.state` -> `server`; a top-level module is its own package."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@cache
def package_imports() -> dict[str, dict[str, str]]:
    """package -> {package it imports: one `file:line` that does}."""
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for module, targets in module_imports().items():
        source = package_of(module)
        if not source:
            continue
        graph[source]  # every package is a node, the ones that import nothing too
        for target, line in targets.items():
            if package_of(target) != source:
                where = f"{_files()[module].relative_to(ROOT.parent)}:{line}"
                graph[source].setdefault(package_of(target), where)
    return dict(graph)


def _cycle(graph: dict[str, dict[str, str]] | dict[str, dict[str, int]]) -> list[str]:
    try:
        graphlib.TopologicalSorter({node: set(targets) for node, targets in graph.items()}).prepare()
    except graphlib.CycleError as error:  # each node of its cycle is imported by the next: turn it round
        return error.args[1][::-1]
    return []


def _shown(cycle: list[str], graph: dict) -> str:
    return "; ".join(f"{a} -> {b} ({graph[a][b]})" for a, b in pairwise(cycle))


def test_no_module_imports_itself_back():
    cycle = _cycle(module_imports())
    assert not cycle, f"modules import each other in a circle: {_shown(cycle, module_imports())}"


def test_no_package_imports_itself_back_through_any_chain():
    graph = package_imports()
    cycle = _cycle(graph)
    assert not cycle, f"packages import each other in a circle: {_shown(cycle, graph)}"


def room_of(module: str, package: str) -> str | None:
    """The room of `package` that `module` is in: its sub-package or module right below the package
    (`ollama_spec.server.serving.state` -> `serving` in `server`); None outside it, or for the package's own face."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == package else None


def room_imports(package: str) -> dict[str, dict[str, str]]:
    """room of `package` -> {room of it that it imports: one `file:line` that does}."""
    graph: dict[str, dict[str, str]] = defaultdict(dict)
    for module, targets in module_imports().items():
        if (source := room_of(module, package)) is None:
            continue
        graph[source]
        for target, line in targets.items():
            if (room := room_of(target, package)) not in (None, source):
                graph[source].setdefault(room, f"{_files()[module].relative_to(ROOT.parent)}:{line}")
    return dict(graph)


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_no_room_inside_a_package_imports_another_back(package):
    graph = room_imports(package)
    cycle = _cycle(graph)
    assert not cycle, f"rooms of {package}/ import each other in a circle: {_shown(cycle, graph)}"


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_every_room_has_its_floor(package):
    placed = [room for floor in ROOMS[package] for room in floor]
    assert sorted(placed) == sorted(room_imports(package)), f"a room new to {package}/: give it its floor in ROOMS"


def arrows_back_up(graph: dict[str, dict[str, str]], floors: tuple[tuple[str, ...], ...]) -> list[str]:
    """Each `source -> target (file:line)` of `graph` whose target is on the source's floor or above it."""
    floor = {name: n for n, names in enumerate(floors) for name in names}
    return [
        f"{source} -> {target} ({where})"
        for source, targets in graph.items()
        for target, where in targets.items()
        if floor.get(target, -1) >= floor.get(source, len(floors))
    ]


@pytest.mark.parametrize("package", sorted(ROOMS))
def test_a_room_imports_only_the_floors_below_its_own(package):
    upward = arrows_back_up(room_imports(package), ROOMS[package])
    assert not upward, f"imports back up inside {package}/: " + "; ".join(upward)


def test_an_arrow_back_up_is_found():
    graph = {"http": {"serving": "http/app.py:1"}, "serving": {"protocol": "serving/state.py:2"}, "protocol": {}}
    floors = (("serving",), ("protocol",), ("http",))
    assert arrows_back_up(graph, floors) == ["serving -> protocol (serving/state.py:2)"]


def test_a_circle_of_rooms_is_found():
    graph = {"core": {"worker": "core/errors.py:1"}, "worker": {"core": "worker.py:2"}, "app": {"core": "app.py:3"}}
    assert sorted(_cycle(graph)[:2]) == ["core", "worker"]


def test_every_package_has_its_place_in_the_walk():
    placed = [package for layer in WALK for package in layer]
    assert sorted(placed) == sorted(package_imports()), "a package new to the walk: give it its layer in WALK"


def test_a_package_imports_only_the_layers_below_its_own():
    upward = arrows_back_up(package_imports(), WALK)
    assert not upward, "imports against the walk: " + "; ".join(upward)


def test_only_cli_imports_the_other_faces():
    crossing = [
        f"{source} -> {target} ({where})"
        for source, targets in package_imports().items()
        for target, where in targets.items()
        if target in FACES and source not in ("cli", "__main__")
    ]
    assert not crossing, "only cli/ (and `python -m`) may import a face: " + "; ".join(crossing)


if __name__ == "__main__":
    for number, packages in reversed(list(enumerate(WALK))):
        for package in packages:
            targets = sorted(package_imports().get(package, {}))
            print(f"{number}  {package:<13} -> {', '.join(targets) or '-'}")
    for package, floors in ROOMS.items():
        print(f"\ninside {package}/:")
        for number, rooms in reversed(list(enumerate(floors))):
            for room in rooms:
                print(f"{number}  {room:<13} -> {', '.join(sorted(room_imports(package).get(room, {}))) or '-'}")
