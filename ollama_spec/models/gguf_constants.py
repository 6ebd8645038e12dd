"""The `gguf` package's constants (value and quantization types, their sizes), without the package.

`import gguf` runs its __init__, which imports numpy and the whole writer: a quarter of a second
that `list` and `show`, which read headers only, need not spend. Its constants module is plain
Python, so it is loaded from the installed package on its own, under its own name: a later
`import gguf` finds it there and uses the same classes.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _constants():
    loaded = sys.modules.get("gguf.constants")
    if loaded is not None:
        return loaded
    package = importlib.util.find_spec("gguf")  # finds the package without running its __init__
    if package is None or not package.submodule_search_locations:
        raise ImportError("the gguf package is not installed: pip install gguf")
    path = Path(next(iter(package.submodule_search_locations))) / "constants.py"
    spec = importlib.util.spec_from_file_location("gguf.constants", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["gguf.constants"] = module
    spec.loader.exec_module(module)
    return module


_module = _constants()
GGUFValueType = _module.GGUFValueType
GGMLQuantizationType = _module.GGMLQuantizationType
GGML_QUANT_SIZES = _module.GGML_QUANT_SIZES
LlamaFileType = _module.LlamaFileType
