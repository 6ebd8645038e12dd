"""Small pieces: no module over 400 lines, no function over 60, no class over 20 methods (ollama_spec/).

Read from the source alone (ast). A function's lines run from its `def` to its last line (decorators and
Click options not counted, its docstring and nested functions counted); a class's methods are the functions
right in its body, properties included.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).parent.parent / "ollama_spec"
MAX_FILE_LINES = 400
MAX_FUNCTION_LINES = 60
MAX_METHODS = 20

# What is still being split, each by the helper who owns it; an entry goes once its piece is under the
# limit (test_the_allowed_are_still_over_the_limit says which).
ALLOWED: set[str] = set()


def _functions(node: ast.AST, prefix: str = ""):
    """(qualified name, node) of every function and class under `node`, nested ones too."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            yield f"{prefix}{child.name}", child
            yield from _functions(child, f"{prefix}{child.name}.")
        else:
            yield from _functions(child, prefix)


def over_the_limits(root: Path) -> dict[str, str]:
    """`file`, `file:function` or `file:Class` under `root` -> how far over its limit it is."""
    over = {}
    for path in sorted(root.rglob("*.py")):
        text, where = path.read_text(encoding="utf-8"), path.relative_to(root).as_posix()
        if (lines := len(text.splitlines())) > MAX_FILE_LINES:
            over[where] = f"{lines} lines"
        for name, node in _functions(ast.parse(text)):
            if isinstance(node, ast.ClassDef):
                methods = sum(isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) for item in node.body)
                if methods > MAX_METHODS:
                    over[f"{where}:{name}"] = f"{methods} methods"
            elif (lines := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                over[f"{where}:{name}"] = f"{lines} lines"
    return over


@cache
def _package_over() -> dict[str, str]:
    return over_the_limits(ROOT)


def test_no_module_function_or_class_is_over_its_limit():
    over = {name: size for name, size in _package_over().items() if name not in ALLOWED}
    assert not over, (
        f"split these (files <= {MAX_FILE_LINES} lines, functions <= {MAX_FUNCTION_LINES} lines, "
        f"classes <= {MAX_METHODS} methods): {over}"
    )


def test_the_allowed_are_still_over_the_limit():
    stale = sorted(ALLOWED - set(_package_over()))
    assert not stale, f"under the limits now: take these out of ALLOWED: {stale}"


def test_a_long_function_a_large_class_and_a_long_file_are_found(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    methods = "\n".join(f"    def m{i}(self):\n        pass" for i in range(MAX_METHODS + 1))
    source = f"def long():\n{body}\n\n\nclass Wide:\n{methods}\n" + "#\n" * MAX_FILE_LINES
    (tmp_path / "mod.py").write_text(source, encoding="utf-8")
    assert over_the_limits(tmp_path) == {
        "mod.py": f"{len(source.splitlines())} lines",
        "mod.py:long": f"{MAX_FUNCTION_LINES + 1} lines",
        "mod.py:Wide": f"{MAX_METHODS + 1} methods",
    }
