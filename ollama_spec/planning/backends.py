"""What the installed llama.cpp was built with and sees, as plain data: its backends and their devices.

llama/backends.py reads them from ggml's backend registry; doctor and the RPC code read these.
"""

from __future__ import annotations

from dataclasses import dataclass

HOST_BACKENDS = ("CPU", "BLAS", "RPC")  # registered backends that are not a GPU


@dataclass(frozen=True)
class BackendDevice:
    """One device llama.cpp can place tensors on; sizes in bytes as the backend reports them."""

    name: str
    description: str
    type: str  # "cpu", "gpu", "igpu", "accel"
    free: int
    total: int
    backend: str = ""  # the registered backend it belongs to: "CUDA", "CPU", "RPC", ...

    @property
    def is_remote(self) -> bool:
        """A device on another machine, reached through llama.cpp's RPC backend."""
        return self.backend == "RPC"

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "type": self.type,
            "free": self.free,
            "total": self.total,
            "backend": self.backend,
        }


@dataclass(frozen=True)
class BackendReport:
    backends: tuple[str, ...]  # registered backends, e.g. ("CUDA", "CPU")
    devices: tuple[BackendDevice, ...]

    @property
    def gpu_backends(self) -> tuple[str, ...]:
        return tuple(b for b in self.backends if b not in HOST_BACKENDS)

    def to_json(self) -> dict:
        return {"backends": list(self.backends), "devices": [d.to_json() for d in self.devices]}
