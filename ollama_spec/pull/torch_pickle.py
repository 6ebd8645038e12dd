"""A `pytorch_model.bin` state dict read without torch and without running its pickle.

torch.save writes a zip: `<name>/data.pkl` (a pickle of the state dict whose tensors point at storages by
key), `<name>/data/<key>` (each storage's raw little-endian elements) and `<name>/byteorder`. The pickle is
read by an unpickler that knows only the handful of callables a state dict names (OrderedDict, torch's
tensor and parameter rebuilders, the storage types) and refuses anything else, so a hostile file can name
no code to run. Some published EAGLE-3 heads (yuhuili/EAGLE3-*) ship only this format.
"""

from __future__ import annotations

import collections
import pickle
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ollama_spec.errors import PullError

STORAGE_DTYPES = {
    "HalfStorage": ("<f2", "F16"),
    "BFloat16Storage": ("<u2", "BF16"),  # kept as raw bits: numpy has no bfloat16
    "FloatStorage": ("<f4", "F32"),
    "DoubleStorage": ("<f8", "F64"),
    "LongStorage": ("<i8", "I64"),
    "IntStorage": ("<i4", "I32"),
    "BoolStorage": ("?", "BOOL"),
}


@dataclass(frozen=True)
class _StorageType:
    dtype: str
    name: str


@dataclass(frozen=True)
class _Storage:
    kind: _StorageType
    key: str


@dataclass(frozen=True)
class _TensorRef:
    storage: _Storage
    offset: int  # in elements
    shape: tuple[int, ...]
    stride: tuple[int, ...]


def _rebuild_tensor(storage, offset, shape, stride, *_rest) -> _TensorRef:
    if not isinstance(storage, _Storage):
        raise pickle.UnpicklingError("a tensor without a storage")
    return _TensorRef(storage, int(offset), tuple(int(v) for v in shape), tuple(int(v) for v in stride))


def _rebuild_parameter(data, *_rest):
    return data


_ALLOWED = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
}


class _StateDictUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) in _ALLOWED:
            return _ALLOWED[(module, name)]
        if module == "torch" and name in STORAGE_DTYPES:
            return _StorageType(*STORAGE_DTYPES[name])
        raise pickle.UnpicklingError(f"it names {module}.{name}, which a state dict of tensors does not need")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) >= 3 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise pickle.UnpicklingError(f"an unknown persistent id {pid!r:.80}")
        return _Storage(pid[1], str(pid[2]))


def read_torch_checkpoint(path: Path) -> Iterator[tuple[str, tuple[int, ...], str, Callable[[], np.ndarray]]]:
    """(name, shape, dtype, load) for every tensor of a torch.save'd state dict; PullError when the file is no such zip or its pickle names anything but tensors."""
    try:
        archive = zipfile.ZipFile(path)
        pickles = [n for n in archive.namelist() if n.endswith("data.pkl")]
        if len(pickles) != 1:
            raise PullError(f"{path.name} is not a torch state dict (no single data.pkl in it)")
        prefix = pickles[0][: -len("data.pkl")]
        byteorder = f"{prefix}byteorder"
        if byteorder in archive.namelist() and archive.read(byteorder).strip() != b"little":
            raise PullError(f"{path.name} was saved big-endian, which is not supported")
        with archive.open(pickles[0]) as f:
            state = _StateDictUnpickler(f).load()
    except (zipfile.BadZipFile, OSError) as exc:
        raise PullError(f"{path.name} is not a readable torch checkpoint ({exc})") from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        raise PullError(f"{path.name} is not a plain state dict of tensors: {exc}") from None
    if not isinstance(state, dict) or not all(isinstance(v, _TensorRef) for v in state.values()):
        raise PullError(f"{path.name} is not a plain state dict of tensors")
    for name, ref in state.items():
        yield str(name), ref.shape, ref.storage.kind.name, _loader(archive, prefix, ref, path.name)


def _loader(archive: zipfile.ZipFile, prefix: str, ref: _TensorRef, file_name: str) -> Callable[[], np.ndarray]:
    def load() -> np.ndarray:
        try:
            raw = archive.read(f"{prefix}data/{ref.storage.key}")
        except KeyError:
            raise PullError(f"{file_name} lacks the storage {ref.storage.key} a tensor points at") from None
        data = np.frombuffer(raw, dtype=ref.storage.kind.dtype)
        count = int(np.prod(ref.shape))
        if (
            count
            and ref.offset + max(((d - 1) * s for d, s in zip(ref.shape, ref.stride, strict=True)), default=0)
            >= data.size
        ):
            raise PullError(f"{file_name}: a tensor reaches past its storage {ref.storage.key}")
        view = np.lib.stride_tricks.as_strided(
            data[ref.offset :], ref.shape, tuple(s * data.itemsize for s in ref.stride), writeable=False
        )
        return np.ascontiguousarray(view)

    return load
